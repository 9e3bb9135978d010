"""The small CNN of ddp_plain.py trained with partial reduce: each rank steps its own replica and
averages it with the first ranks ready, so a slow rank holds up only its group.

    antdt up --mode preduce   # in another terminal (adds the grouper), export what it prints, and:
    torchrun --nproc-per-node 3 examples/preduce_antdt.py

``diff examples/ddp_plain.py examples/preduce_antdt.py`` shows what antdt changes.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from images import SmallCNN, SyntheticImages, accuracy, one_gpu_per_rank  # noqa: E402

from antdt.worker.preduce import PartialReduceJob  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/example.pt"))
    args = parser.parse_args()
    cuda = one_gpu_per_rank()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    dataset = SyntheticImages(args.samples)
    with PartialReduceJob(
        model,
        optimizer,
        dataset,
        batch_size=args.batch_size,
        epochs=args.epochs,
        checkpoint=args.checkpoint,
    ) as job:
        for inputs, labels in job.batches():
            loss = F.cross_entropy(model(inputs.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if dist.get_rank() == 0:
        print(f"held-out accuracy {accuracy(model, dataset.heldout(), device):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
