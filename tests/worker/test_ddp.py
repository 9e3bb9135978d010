"""What synchronous ranks share around their collectives: the step-sized bound, a stuck rank
noticed within it, and one agreed checkpoint version (real gloo groups where ranks are involved).

The weighted all-reduce itself is DDP's, with antdt's communication hook
(tests/worker/test_ddp_hook.py); partial reduce's group averages are in
tests/worker/preduce.
"""

from __future__ import annotations

import datetime
import os
import re
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from antdt.worker.ddp import (
    CollectiveTimeout,
    DistributedError,
    StepSizedTimeout,
    agreed_checkpoint_version,
    gather_objects,
    wait_within,
)
from tests.worker.groups import bounded_all_reduce, join_gloo


def version_rank(rank: int, init_file: str, out_dir: str) -> None:
    """Every rank flushes, only rank 0 asks; rank 0's failure to ask reaches every rank; then each
    rank's object is gathered on every rank."""
    join_gloo(init_file, rank, 3)
    try:
        flushed = []
        version = agreed_checkpoint_version(lambda: flushed.append(1), lambda: 41 + rank)
        try:
            agreed_checkpoint_version(lambda: None, lambda: 1 // 0)
            failure = None
        except ZeroDivisionError:
            failure = "asked and failed"
        except DistributedError:
            failure = "told"
        gathered = gather_objects({"rank": rank, "runs": (rank,) * rank}, None, torch.device("cpu"))
        torch.save(
            {"version": version, "flushed": len(flushed), "failure": failure, "gathered": gathered},
            Path(out_dir) / f"rank{rank}.pt",
        )
        dist.barrier()  # nobody tears the group down while a peer is still in the last collective
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_gets_rank_0_s_version_its_failure_and_every_rank_s_objects(tmp_path: Path):
    mp.spawn(version_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=3, join=True)
    for rank in range(3):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["version"] == 41 and got["flushed"] == 1
        assert got["failure"] == ("asked and failed" if rank == 0 else "told")
        # every rank's object, in rank order, on every rank (a pooled epoch tail's offers)
        assert got["gathered"] == [{"rank": r, "runs": (r,) * r} for r in range(3)]


def stuck_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 1 stops taking part after three steps (stuck, not dead); rank 0 must give up on its
    own."""
    join_gloo(init_file, rank)
    timeout = StepSizedTimeout(floor_s=1.0, factor=4.0, first_s=30.0)
    outcome = Path(out_dir) / f"rank-{rank}.txt"
    try:
        for step in range(5):
            if rank == 1 and step == 3:
                outcome.write_text("stuck")
                time.sleep(20)  # longer than rank 0's bound; the test does not wait for it
                return
            bounded_all_reduce(torch.ones(8), timeout, step)
        outcome.write_text("finished")
    except CollectiveTimeout as exc:
        outcome.write_text(str(exc))
    finally:
        if rank == 0:
            # the group is unusable: leave without the collective clean-up, as a real rank must
            os._exit(0)


def test_a_stuck_rank_is_noticed_within_the_step_sized_bound(tmp_path: Path):
    context = mp.start_processes(
        stuck_rank_main,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    try:
        rank0 = context.processes[0]
        rank0.join(timeout=25)
        assert rank0.exitcode == 0, "rank 0 did not give up on the stuck rank"
        message = (tmp_path / "rank-0.txt").read_text()
        assert (
            message.startswith("the all-reduce of step 3 waited")
            and "a rank is dead or stuck" in message
        )
        # 4x steps of milliseconds is below the 1.0 s floor (a step this machine stalled for a
        # moment can raise it a little: the limit is step-sized, never the hung cap of minutes)
        limit = float(re.search(r"limit (\d+(?:\.\d+)?) s", message).group(1))
        assert 1.0 <= limit < 5.0, message
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


class Unfinished:
    """A collective that never finishes: its wait raises what the backend raises past the
    timeout."""

    def __init__(self, text: str):
        self.text = text

    def wait(self, timeout: datetime.timedelta) -> None:
        raise RuntimeError(self.text)


@pytest.mark.parametrize(
    "text",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Timed out waiting 1000ms for recv operation to complete",
        "[PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=1000) "
        "ran for 1003 milliseconds before timing out.",
    ],
)
def test_either_backends_timeout_is_a_collective_timeout(text: str):
    with pytest.raises(
        CollectiveTimeout, match="the all-reduce of step 3 waited .* a rank is dead or stuck"
    ):
        wait_within([Unfinished(text)], 1.0, "the all-reduce of step 3")


def test_another_failure_of_a_collective_is_not_called_a_timeout():
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        wait_within(
            [
                Unfinished(
                    "[gloo/transport/tcp/pair.cc:598] Connection closed by peer: "
                    "Connection reset by peer"
                )
            ],
            1.0,
            "the all-reduce of step 3",
        )


def test_the_bound_follows_the_slowest_recent_step():
    bound = StepSizedTimeout(floor_s=1.0, factor=5.0, window=3, first_s=60.0)
    assert bound.limit_s() == 60.0
    for now in (0.0, 0.1, 0.2, 2.2, 2.3, 2.4, 2.5):
        bound.completed(now)
    # the 2 s period has left the window of three; 5 x 0.1 s is below the floor
    assert bound.limit_s() == 1.0
    bound.completed(5.5)
    assert bound.limit_s() == pytest.approx(15.0)


# ------------------------------------------------------------------ one process


def test_checkpoint_version_without_distributed_flushes_then_asks():
    calls = []
    assert (
        agreed_checkpoint_version(lambda: calls.append("flush"), lambda: calls.append("ask") or 7)
        == 7
    )
    assert calls == ["flush", "ask"]
