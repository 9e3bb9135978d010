"""Group rounds in the background: the snapshot is averaged while the replica trains on, and the
replicas' sum never moves.

Real gloo ranks exchange real snapshots on the background thread; the
grouper's answer comes from a stand-in (the bus and the grouper are run by
``test_torchrun.py`` and the chaos tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from antdt.schemas.models import GroupReason
from antdt.worker.ddp import CollectiveTimeout
from antdt.worker.preduce.averaging import GroupAverager
from antdt.worker.preduce.client import NoGroup
from antdt.worker.preduce.rounds import SILENT_PEER_LIMIT_S, BackgroundRounds
from tests.worker.groups import join_gloo
from tests.worker.preduce.test_averaging import group, replica, values


class Grouper:
    """Answers every announcement with the group it was built with, and records the steps."""

    def __init__(self, formed):
        self.formed, self.announced = formed, []

    def announce(self, step: int, finished: bool = False) -> int:
        self.announced.append(step)
        return len(self.announced)

    def wait(self, seq: int, timeout_s: float, stop=None, broken=None):
        return self.formed


class Unanswered(Grouper):
    """Forms no group: waits out its bound as the client does, asking ``broken`` as it goes."""

    def __init__(self):
        super().__init__(None)

    def wait(self, seq: int, timeout_s: float, stop=None, broken=None):
        for waited_s in (1.0, SILENT_PEER_LIMIT_S + 1.0, timeout_s):
            if broken is not None and (why := broken(waited_s)) is not None:
                raise CollectiveTimeout(why)
        raise NoGroup(f"no group within {timeout_s:.0f} s")


class Peers:
    """What a rank's heartbeat thread last saw: these ranks stopped beating."""

    def __init__(self, silent: list[int]):
        self.silent = silent

    def silent_now(self) -> list[int]:
        return self.silent


def stepped(model: torch.nn.Module, by: float) -> None:
    """A local step's worth of change: every value moved by ``by``."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + [model[1].running_mean]:
            tensor.add_(by)


def rounds_main(rank: int, init_file: str, out_dir: str) -> None:
    join_gloo(init_file, rank, 2)
    model = replica(rank)  # every value: the rank
    averager = GroupAverager(model, timeout_s=20.0)
    rounds = BackgroundRounds(Grouper(group([0, 1], 5, me=rank)), averager, group_wait_s=10.0)
    rounds.start(step=3)  # snapshot: the rank's value
    stepped(model, 10.0 * (rank + 1))  # trains on while the pair averages the snapshots
    outcome = rounds.take()
    averager.add(outcome.delta)
    after_pair = values(model)
    alone = BackgroundRounds(
        Grouper(group([rank], 6, GroupReason.DEADLINE, me=rank)), averager, 10.0
    )
    alone.start(step=4)
    nothing = alone.take().delta
    rounds.close()
    alone.close()
    Path(out_dir, f"rank-{rank}.txt").write_text(repr((sorted(after_pair), nothing)))
    dist.destroy_process_group()


def test_a_pair_averages_its_snapshots_and_keeps_the_steps_taken_since(tmp_path: Path):
    mp.spawn(rounds_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    outcomes = [eval((tmp_path / f"rank-{r}.txt").read_text()) for r in (0, 1)]  # noqa: S307
    # the snapshots' mean (0 + 1) / 2, plus each rank's own step since: 10 and 20
    assert outcomes[0] == ([10.5], None) and outcomes[1] == ([20.5], None)
    # the replicas' sum is what it was before the average: (0 + 10) + (1 + 20)
    assert outcomes[0][0][0] + outcomes[1][0][0] == 31.0


def test_a_wait_for_a_group_ends_once_a_rank_has_stopped_beating_and_not_while_all_beat():
    """A group of every rank needs a rank that is gone (an evicted node) for ever: the group is
    broken past the limit, not after the group's whole bound; a slow rank still beats."""
    averager = GroupAverager(replica(0))
    gone = BackgroundRounds(Unanswered(), averager, group_wait_s=120.0, peers=Peers([2]))
    gone.start(step=7)
    with pytest.raises(CollectiveTimeout, match=r"rank\(s\) 2 stopped beating"):
        gone.take()
    slow = BackgroundRounds(Unanswered(), averager, group_wait_s=120.0, peers=Peers([]))
    slow.start(step=7)
    with pytest.raises(NoGroup, match="within 120 s"):
        slow.take()
    for rounds in (gone, slow):
        rounds.close()
