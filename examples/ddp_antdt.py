"""A small CNN on synthetic images under torchrun: plain DDP (ddp_plain.py), or with antdt
(ddp_antdt.py).

    torchrun --nproc-per-node 3 examples/ddp_plain.py
    antdt up      # in another terminal, then export what it prints, and:
    torchrun --nproc-per-node 3 examples/ddp_antdt.py

``diff examples/ddp_plain.py examples/ddp_antdt.py`` shows what antdt changes.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).parent))
from images import SmallCNN, SyntheticImages, accuracy, one_gpu_per_rank  # noqa: E402

from antdt.worker import ElasticJob  # noqa: E402


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
    ddp = DistributedDataParallel(model)
    with ElasticJob(
        ddp,
        optimizer,
        dataset,
        batch_size=args.batch_size,
        epochs=args.epochs,
        checkpoint=args.checkpoint,
    ) as job:
        for inputs, labels in job.batches():
            loss = F.cross_entropy(ddp(inputs.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if dist.get_rank() == 0:
        print(f"held-out accuracy {accuracy(model, dataset.heldout(), device):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
