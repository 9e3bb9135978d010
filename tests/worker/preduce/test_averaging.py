"""Averaging replicas in partial-reduce groups: real gloo process groups, point to point,
bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from antdt.errors import AntdtError
from antdt.schemas.models import GroupFormed, GroupReason
from antdt.schemas.types import utc_now
from antdt.worker.ddp import CollectiveTimeout
from antdt.worker.preduce.averaging import GroupAverager
from tests.worker.groups import ON_EACH_DEVICE, join_gloo

WORLD = 4


def group(
    ranks: list[int], group_id: int, reason: GroupReason = GroupReason.QUORUM, me: int = 0
) -> GroupFormed:
    return GroupFormed(
        job_id="j",
        worker_id=f"w{me}",
        group_id=group_id,
        generation=0,
        reason=reason,
        members=[f"w{r}" for r in ranks],
        ranks=ranks,
        in_reply_to=1,
        waited_ms=0,
        timestamp=utc_now(),
    )


def replica(rank: int) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        for tensor in list(model.parameters()) + [model[1].running_mean]:
            tensor.fill_(float(rank))
    return model


def values(model: torch.nn.Module) -> set[float]:
    return {
        round(float(v), 5)
        for t in list(model.parameters()) + [model[1].running_mean]
        for v in t.reshape(-1)
    }


def averaging_main(rank: int, init_file: str, out_dir: str, device: str = "cpu") -> None:
    join_gloo(init_file, rank, WORLD)
    model = replica(rank).to(device)
    averager = GroupAverager(model, timeout_s=20.0)
    pair = [0, 2] if rank in (0, 2) else [1, 3]  # two groups at once, over disjoint pairs
    averager.average(group(pair, 7 + pair[0], me=rank))
    after_pair = values(model)
    triple = [0, 1, 2]  # through the leader; rank 3 meanwhile alone: a group of one, nothing moves
    alone = averager.average(
        group(triple, 20, me=rank)
        if rank in triple
        else group([rank], 21, GroupReason.DEADLINE, me=rank)
    )
    after_triple = values(model)
    ledger = torch.zeros(WORLD * 2, dtype=torch.int32)
    ledger[rank * 2 : rank * 2 + 2] = 1
    summed = averager.average(group(list(range(WORLD)), 30, GroupReason.FINAL, me=rank), ledger)
    Path(out_dir, f"rank-{rank}.txt").write_text(
        repr(
            (
                sorted(after_pair),
                alone,
                sorted(after_triple),
                sorted(values(model)),
                summed.tolist(),
            )
        )
    )
    dist.destroy_process_group()


@ON_EACH_DEVICE
def test_groups_average_their_members_only_and_the_final_group_makes_one_model_and_one_ledger(
    device: str, tmp_path: Path
):
    mp.spawn(
        averaging_main,
        args=(str(tmp_path / "init"), str(tmp_path), device),
        nprocs=WORLD,
        join=True,
    )
    for rank in range(WORLD):
        after_pair, alone, after_triple, final, ledger = eval(
            (tmp_path / f"rank-{rank}.txt").read_text()
        )  # noqa: S307
        # (0+2)/2 and (1+3)/2, swapped at once
        assert after_pair == [1.0 if rank in (0, 2) else 2.0]
        # (1+2+1)/3; rank 3 untouched
        assert alone is None and after_triple == [1.33333 if rank < 3 else 2.0]
        assert final == [1.5]  # the mean of all replicas, kept by every average: (0+1+2+3)/4
        assert ledger == [1] * (WORLD * 2)  # every rank's samples, once


def silent_member_main(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 1 is in rank 0's group but never sends (stuck): rank 0 must give up within its bound."""
    join_gloo(init_file, rank)
    outcome = Path(out_dir) / f"rank-{rank}.txt"
    if rank == 1:
        outcome.write_text("stuck")
        import time

        time.sleep(20)  # longer than rank 0's bound; the test does not wait for it
        return
    try:
        GroupAverager(replica(0), timeout_s=1.0).average(group([0, 1], 3))
        outcome.write_text("averaged")
    except CollectiveTimeout as exc:
        outcome.write_text(str(exc))
    finally:
        # the group is unusable: leave without the collective clean-up, as a real rank must
        os._exit(0)


def test_a_member_that_never_sends_is_noticed_within_the_bound(tmp_path: Path):
    context = mp.start_processes(
        silent_member_main,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    try:
        context.processes[0].join(timeout=25)
        assert context.processes[0].exitcode == 0, "rank 0 did not give up on the silent member"
        message = (tmp_path / "rank-0.txt").read_text()
        assert (
            message.startswith("group 3: swapping with rank 1: waited")
            and "dead or stuck" in message
        )
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def test_a_model_across_devices_or_dtypes_is_refused():
    with pytest.raises(AntdtError, match="one device with one dtype"):
        GroupAverager(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double()))
