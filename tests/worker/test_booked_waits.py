"""A collective outside antdt's step that waits for a slower rank is booked as sync wait.

Two real gloo ranks run DDP on a model with BatchNorm, whose buffers DDP
broadcasts from rank 0 before each forward pass; rank 1 comes to its
forward pass a second late. Booked through :func:`book_as_sync_wait`,
rank 0's wait for it is sync wait, not compute: as compute it made a healthy
rank 0 look as slow as the straggler, and DD gave it less (the framework
examples: Lightning's SIGTERM broadcast, a transformer's buffers).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from antdt.worker.agent import Agent
from antdt.worker.booked_waits import book_as_sync_wait
from tests.worker.groups import join_gloo

LATE_S = 1.0  # rank 1's lateness at its forward pass


def rank_main(rank: int, init_file: str, out_dir: str) -> None:
    join_gloo(init_file, rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    ddp = DistributedDataParallel(model)
    agent = Agent("job", f"w{rank}", rank=rank, listen_for_commands=False)
    booked = book_as_sync_wait(ddp, "_sync_buffers", agent, torch.device("cpu"))
    dist.barrier()
    agent.step()  # the step timed below starts here, on both ranks at once
    if rank == 1:
        time.sleep(LATE_S)
    ddp(torch.randn(6, 4)).sum().backward()
    record = agent.step()
    Path(out_dir, f"rank-{rank}.txt").write_text(
        f"{int(booked)} {record.compute_s} {record.sync_wait_s}"
    )
    dist.destroy_process_group()
    # what is tested is written: leave without the interpreter's teardown, in which a rank of the
    # full suite once aborted inside torch ("terminate called without an active exception")
    os._exit(0)


def test_rank_0_s_buffer_broadcast_waiting_for_a_late_rank_is_sync_wait_not_compute(tmp_path):
    mp.spawn(rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    booked, compute, sync = (tmp_path / "rank-0.txt").read_text().split()
    assert booked == "1", "this torch's DDP has no _sync_buffers: the wait is not booked"
    # the wait is most of the second; the step's own work (a 6-sample forward and backward) is
    # milliseconds: counted as compute the wait would be a second of it
    assert float(sync) >= LATE_S / 2 > float(compute)


class Counter:
    """An object whose method the tests wrap."""

    def __init__(self):
        self.calls = 0

    def tick(self, pause_s: float = 0.0) -> int:
        time.sleep(pause_s)
        self.calls += 1
        return self.calls


def test_the_wrapped_method_still_runs_and_its_time_is_the_agent_s_sync_wait():
    agent = Agent("job", "w0", listen_for_commands=False)
    counter = Counter()
    assert book_as_sync_wait(counter, "tick", agent, torch.device("cpu"))
    assert counter.tick(0.05) == 1
    record = agent.step()
    assert record.sync_wait_s >= 0.05 and counter.calls == 1


def test_a_missing_method_is_no_collective_and_nothing_is_wrapped():
    counter = Counter()
    agent = Agent("job", "w0", listen_for_commands=False)
    assert not book_as_sync_wait(counter, "_broadcast_sigterm_tensor", agent, torch.device("cpu"))
    assert not hasattr(counter, "_broadcast_sigterm_tensor")


def test_installing_again_replaces_the_wrapper_and_books_to_the_new_agent():
    counter = Counter()
    first = Agent("job", "w0", listen_for_commands=False)
    second = Agent("job", "w0", listen_for_commands=False)
    book_as_sync_wait(counter, "tick", first, torch.device("cpu"))
    book_as_sync_wait(counter, "tick", second, torch.device("cpu"))
    counter.tick(0.05)
    assert second.step().sync_wait_s >= 0.05 > first.step().sync_wait_s
