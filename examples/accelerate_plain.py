"""A small CNN on synthetic images in a loop of one's own with Hugging Face Accelerate under
torchrun: Accelerate's own data sharding (accelerate_plain.py), or with antdt
(accelerate_antdt.py).

    torchrun --nproc-per-node 3 examples/accelerate_plain.py
    antdt up      # in another terminal, then export what it prints, and:
    torchrun --nproc-per-node 3 examples/accelerate_antdt.py

``diff examples/accelerate_plain.py examples/accelerate_antdt.py`` shows what antdt changes.
On CPUs ``Accelerator(cpu=True)``: without it each rank trains alone.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from images import SmallCNN, SyntheticImages, accuracy, one_gpu_per_rank  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=not one_gpu_per_rank())
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    dataset = SyntheticImages(args.samples)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(args.epochs):
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
    if accelerator.is_main_process:
        device = accelerator.device
        held_out = accuracy(accelerator.unwrap_model(model), dataset.heldout(), device)
        print(f"held-out accuracy {held_out:.3f}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
