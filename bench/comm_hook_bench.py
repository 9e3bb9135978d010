"""What a DDP communication hook costs per step: DDP's own, a Python pass-through, antdt's.

Gloo ranks (``--ranks``, 2 by default; spawned, one thread each) train
``user_job.py``'s MLP on one fixed batch (``--batch`` samples, 32 by default),
so the step is only forward, backward with DDP's all-reduce,
and the optimizer step. Three ways to reduce the gradients:

* ``ddp``: DDP's built-in all-reduce (C++, no hook);
* ``python``: a Python hook that all-reduces each bucket and divides it by
  the world size (what any Python hook costs: a call per bucket and a
  callback when its all-reduce completes);
* ``antdt``: :class:`antdt.worker.ddp_hook.WeightedReduce`, the batch sizes
  and loop numbers carried at the end of the first bucket;
* ``scaled``: a candidate without a Python hook: DDP's built-in all-reduce,
  each rank's gradient weighted through the model output's gradient
  (``world x b_i / B``, a tensor hook), and the loop's numbers in a small
  all-reduce of their own, launched before the forward pass and waited for
  after the backward.

Each is timed over ``--steps`` steps after a warm-up, ``--repeat`` times
(median, min, max of the per-step time).

    python bench/comm_hook_bench.py --repeat 3 --json
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import bench_parser, emit, spread  # noqa: E402
from user_job import mlp  # noqa: E402

from antdt.worker.ddp import collect_cycles_before_exit  # noqa: E402

WAYS = ("ddp", "python", "antdt", "scaled")
WARM_UP = 100


def python_hook(state, bucket):
    """A pass-through Python hook: DDP's average, in Python."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda done: done.value()[0])


class OutputScaled:
    """The ``scaled`` way: the weight on the output's gradient, the numbers beside (docstring)."""

    def __init__(self, ddp: DistributedDataParallel):
        self.weight = 1.0  # world x b_i / B: every rank's batch is the same here
        self.control: tuple | None = None
        ddp.module.register_forward_hook(self._scale_output)

    def _scale_output(self, module, inputs, output):
        output.register_hook(lambda grad: grad * self.weight)

    def begin(self, batch: int, integers) -> None:
        numbers = torch.tensor([float(batch), *integers] * 3)  # as many as the limbs
        self.control = (numbers, dist.all_reduce(numbers, async_op=True))

    def sums(self) -> list:
        numbers, work = self.control
        work.wait()
        return numbers.tolist()


def reducer_for(way: str, ddp: DistributedDataParallel, batch: int):
    """``antdt``'s WeightedReduce (primed), after registering the way's hook; None for the
    others."""
    if way == "python":
        ddp.register_comm_hook(None, python_hook)
    if way == "scaled":
        return OutputScaled(ddp)
    if way != "antdt":
        return None
    from antdt.worker.ddp_hook import WeightedReduce

    reduce = WeightedReduce(ddp)
    reduce.prime(batch)
    return reduce


def rank_main(rank: int, way: str, args, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.ranks
    )
    steps, hidden, batch = args.steps, args.hidden, args.batch
    torch.manual_seed(0)
    model = mlp(64, hidden, 20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = DistributedDataParallel(model)
    # every way, antdt's included: the hook's state and the DDP model sit in reference cycles,
    # and left to the interpreter's end their freeing aborts the process (worker/ddp.py)
    collect_cycles_before_exit()
    reduce = reducer_for(way, ddp, batch)
    inputs, labels = torch.randn(batch, 64), torch.randint(0, 20, (batch,))
    for step in range(WARM_UP + steps):
        if step == WARM_UP:
            dist.barrier()
            began = time.perf_counter()
        if reduce is not None:
            reduce.begin(batch, [1, 0, 0, batch, 0])  # the loop's numbers, as ElasticJob's
        loss = F.cross_entropy(ddp(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        if reduce is not None:
            reduce.sums()
        optimizer.step()
    dist.barrier()
    if rank == 0:
        per_step_ms = (time.perf_counter() - began) / steps * 1e3
        Path(out_dir, "step_ms").write_text(str(per_step_ms))
    dist.destroy_process_group()


def time_way(way: str, args) -> float:
    """Milliseconds per step of one run."""
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(rank_main, args=(way, args, f"{scratch}/init", scratch), nprocs=args.ranks)
        return float(Path(scratch, "step_ms").read_text())


def main() -> int:
    parser = bench_parser(__doc__, ",".join(WAYS))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--hidden", type=int, default=256, help="the MLP's width (256: 85k parameters)"
    )
    parser.add_argument("--batch", type=int, default=32, help="samples per rank")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    ways = args.only.split(",")
    unknown = set(ways) - set(WAYS)
    if unknown:
        parser.error(f"--only takes {', '.join(WAYS)}, not {', '.join(sorted(unknown))}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    times = {way: [] for way in ways}
    for _ in range(args.repeat):  # interleaved, so drift hits every way alike
        for way in ways:
            times[way].append(time_way(way, args))
    base = statistics.median(times["ddp"]) if "ddp" in times else None
    report = {
        "settings": {
            "steps": args.steps,
            "repeat": args.repeat,
            "batch": args.batch,
            "ranks": args.ranks,
            "hidden": args.hidden,
        },
        "step_ms": {way: spread(values) for way, values in times.items()},
        "over_ddp": {
            way: round(statistics.median(values) / base, 3) for way, values in times.items()
        }
        if base
        else {},
    }
    emit(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
