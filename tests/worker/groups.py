"""Real gloo process groups for the tests that spawn ranks."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# A test's ranks on the CPU, and where a GPU is present on it too: over gloo, which reduces CUDA
# tensors (through the host where it sends point to point), every rank on the one device (NCCL
# refuses two ranks per GPU).
ON_EACH_DEVICE = pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ),
    ],
)


def join_gloo(init_file: str, rank: int, world: int = 2, timeout_s: float = 60.0) -> None:
    """This spawned process as ``rank`` of a CPU gloo group met through ``init_file`` (one thread:
    the machine is small)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def rank_0_outcome(rank_main: Callable, tmp_path: Path, fault: str, limit_s: float = 60.0) -> str:
    """Run ``rank_main(rank, init_file, out_dir, fault)`` on two spawned ranks; what rank 0 wrote
    to ``rank-0.txt`` once it ended (within ``limit_s``). Rank 1 may be left stopped: it is
    killed."""
    context = mp.start_processes(
        rank_main,
        args=(str(tmp_path / "init"), str(tmp_path), fault),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    try:
        rank0 = context.processes[0]
        rank0.join(timeout=limit_s)
        assert rank0.exitcode == 0, f"rank 0 did not end within {limit_s:g} s ({fault})"
        return (tmp_path / "rank-0.txt").read_text()
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def bounded_all_reduce(tensor: torch.Tensor, timeout, step: int, peers=None) -> None:
    """One all-reduce waited for within the job's step-sized bound (``timeout``, a
    :class:`~antdt.worker.ddp.StepSizedTimeout`), as the exchanges of antdt's own wait
    (:func:`~antdt.worker.ddp.wait_within`); a completed step feeds the bound."""
    import time

    from antdt.worker.ddp import wait_within

    work = dist.all_reduce(tensor, async_op=True)
    limit = timeout.limit_s()
    wait_within(
        [work],
        limit,
        f"the all-reduce of step {step}",
        f"{limit:.1f} s: {timeout.describe()}",
        peers=peers,
    )
    timeout.completed(time.monotonic())
