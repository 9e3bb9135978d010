"""How many shards an ElasticJob rank holds: two batches' worth and one more, or one that lasts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from antdt.worker.elastic.job import SHARD_LASTS_S, SHARDS_HELD, shards_held


@given(st.integers(1, 4096), st.integers(1, 4096))
def test_the_shards_held_cover_two_batches_and_one_being_granted(batch, shard):
    held = shards_held(batch, shard)
    assert held >= SHARDS_HELD
    assert (held - 1) * shard >= 2 * batch  # the feed's buffer, without the one being granted
    assert held == SHARDS_HELD or (held - 2) * shard < 2 * batch  # and no more than that


def test_default_shards_of_four_batches_or_more_are_held_two_at_a_time():
    assert shards_held(32, 128) == shards_held(512, 2048) == 2
    assert shards_held(34, 16) == 6  # the demo's 16-sample shards under a 34-sample batch


@given(st.integers(1, 4096), st.integers(1, 4096), st.floats(0.0001, 10.0))
def test_a_rank_whose_shards_last_long_holds_one_at_a_time(batch, shard, step_s):
    """Where a shard lasts SHARD_LASTS_S at the rank's pace, the round trip for the next one hides
    in it: one is held, not one more that the rank would train alone at an epoch's end."""
    held = shards_held(batch, shard, step_s)
    lasts_s = shard / batch * step_s
    assert held == (1 if lasts_s >= SHARD_LASTS_S else shards_held(batch, shard))


def test_slowed_and_fast_ranks_under_lightning_hold_as_measured():
    # docs/frameworks.md's slowed run: 3,125-sample shards, steps of about 75 ms
    assert shards_held(270, 3125, 0.075) == 1  # the slowed rank: a shard lasts 0.87 s
    assert shards_held(650, 3125, 0.075) == 2  # the others: 0.36 s
    assert shards_held(32, 128, 0.003) == 2  # the user-style job's short steps
