"""The small CNN of ddp_plain.py trained asynchronously on parameter servers: each rank pulls the
model, pushes its batch's gradient and goes on, so a slow rank slows only itself.

    antdt up --mode async --ps-lr 0.02   # in another terminal (adds the job's parameter servers),
                                         # export what it prints, and:
    torchrun --nproc-per-node 3 examples/ps_antdt.py

``diff examples/ddp_plain.py examples/ps_antdt.py`` shows what antdt changes: no optimizer (the
servers apply SGD), no checkpoints (the servers keep them, with the ledger).
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

from antdt.worker.ps import ParameterServerJob  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    args = parser.parse_args()
    cuda = one_gpu_per_rank()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    dataset = SyntheticImages(args.samples)
    with ParameterServerJob(model, dataset, batch_size=args.batch_size, epochs=args.epochs) as job:
        for inputs, labels in job.batches():
            loss = F.cross_entropy(model(inputs.to(device)), labels.to(device))
            loss.backward()
    if dist.get_rank() == 0:
        print(f"held-out accuracy {accuracy(model, dataset.heldout(), device):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
