"""A small CNN on synthetic images under torchrun: plain DDP (ddp_plain.py), or with antdt
(ddp_antdt.py).

    torchrun --nproc-per-node 3 examples/ddp_plain.py
    antdt up      # in another terminal, then export what it prints, and:
    torchrun --nproc-per-node 3 examples/ddp_antdt.py

``diff examples/ddp_plain.py examples/ddp_antdt.py`` shows what antdt changes.
"""

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
from images import SmallCNN, SyntheticImages, accuracy, one_gpu_per_rank  # noqa: E402


def resume(path: Path, model, optimizer) -> int:
    """The epoch to start from: torchrun restarts the whole group from the last epoch's
    checkpoint."""
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["epoch"]


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
    start = resume(args.checkpoint, model, optimizer)
    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = F.cross_entropy(ddp(inputs.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                },
                args.checkpoint,
            )
    if dist.get_rank() == 0:
        print(f"held-out accuracy {accuracy(model, dataset.heldout(), device):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Free DDP's reference cycles while the interpreter still runs: left to its finalisation,
    # gloo's threads are joined without the GIL and a rank may abort after training
    # ("terminate called without an active exception"; pytorch issue 190489). antdt's jobs do this.
    gc.collect()
