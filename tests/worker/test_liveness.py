"""Heartbeats tell a slow rank from a dead or stopped one: a collective past its bound waits for the
first and gives up on the second, naming it. Real gloo groups and a real store."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from antdt.worker.ddp import CollectiveTimeout, StepSizedTimeout
from antdt.worker.liveness import Beats, PeerLiveness, hang_verdict, silent_ranks
from tests.worker.groups import bounded_all_reduce, join_gloo, rank_0_outcome


def test_a_rank_whose_counter_did_not_move_is_silent():
    before, after = Beats((4, 7, 2), 10.0), Beats((5, 7, 3), 13.0)
    assert silent_ranks(before, after, own_rank=0) == [1]


def test_no_new_read_of_the_store_makes_every_other_rank_silent():
    same = Beats((4, 7, 2), 10.0)
    assert silent_ranks(same, same, own_rank=1) == [0, 2]


@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 3)), min_size=1, max_size=8),
    st.data(),
)
def test_silent_ranks_are_exactly_the_others_that_did_not_beat(counts, data):
    own = data.draw(st.integers(0, len(counts) - 1))
    before = Beats(tuple(c for c, _ in counts), 1.0)
    after = Beats(tuple(c + d for c, d in counts), 2.0)
    assert silent_ranks(before, after, own) == [
        r for r, (_, d) in enumerate(counts) if r != own and d == 0
    ]


def test_a_silent_rank_past_the_limit_ends_the_wait_naming_it():
    verdict = hang_verdict(waited_s=2.5, limit_s=2.0, cap_s=60.0, silent=[1, 3])
    assert verdict is not None and "rank(s) 1, 3 stopped beating" in verdict


def test_every_rank_alive_waits_up_to_the_cap():
    assert hang_verdict(waited_s=50.0, limit_s=2.0, cap_s=60.0, silent=[]) is None
    verdict = hang_verdict(waited_s=61.0, limit_s=2.0, cap_s=60.0, silent=[])
    assert verdict is not None and "every rank alive" in verdict


@given(
    st.floats(0, 100),
    st.floats(0.1, 50),
    st.floats(50, 100),
    st.lists(st.integers(0, 7), max_size=3),
)
def test_a_wait_ends_exactly_when_past_the_limit_with_a_silent_rank_or_past_the_cap(
    waited, limit, cap, silent
):
    must_end = (waited > limit and bool(silent)) or waited > cap
    assert (hang_verdict(waited, limit, cap, silent) is not None) == must_end


def rank_main(rank: int, init_file: str, out_dir: str, fault: str) -> None:
    """Rank 1 misbehaves at step 3 (``fault``: ``slow`` sleeps 4.5 s, ``stop`` sends itself
    SIGSTOP); rank 0's bound is 1 s."""
    join_gloo(init_file, rank)
    peers = PeerLiveness.of_default_group(interval_s=0.2)
    timeout = StepSizedTimeout(floor_s=1.0, factor=4.0, first_s=30.0)
    outcome = Path(out_dir) / f"rank-{rank}.txt"
    try:
        for step in range(6):
            if rank == 1 and step == 3:
                if fault == "slow":
                    time.sleep(4.5)
                else:
                    os.kill(os.getpid(), signal.SIGSTOP)
            bounded_all_reduce(torch.ones(8), timeout, step, peers)
        outcome.write_text("finished")
    except CollectiveTimeout as exc:
        outcome.write_text(str(exc))
    finally:
        peers.close()
        os._exit(0)  # after a timeout the group is unusable: no collective clean-up


def run_pair(tmp_path: Path, fault: str) -> str:
    return rank_0_outcome(rank_main, tmp_path, fault)


def test_a_rank_slower_than_the_bound_but_alive_is_waited_for(tmp_path: Path):
    assert run_pair(tmp_path, "slow") == "finished"


def test_a_stopped_rank_ends_the_wait_naming_it(tmp_path: Path):
    message = run_pair(tmp_path, "stop")
    assert message.startswith("the all-reduce of step 3 waited"), message
    assert "rank(s) 1 stopped beating: dead or stopped" in message


def test_without_a_group_there_is_nothing_to_watch():
    assert not (dist.is_available() and dist.is_initialized())
    assert PeerLiveness.of_default_group() is None
