"""How many shards an ElasticJob rank holds: enough for the feed's two batches and one more."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from antdt.worker.elastic.job import SHARDS_HELD, shards_held


@given(st.integers(1, 4096), st.integers(1, 4096))
def test_the_shards_held_cover_two_batches_and_one_being_granted(batch, shard):
    held = shards_held(batch, shard)
    assert held >= SHARDS_HELD
    assert (held - 1) * shard >= 2 * batch  # the feed's buffer, without the one being granted
    assert held == SHARDS_HELD or (held - 2) * shard < 2 * batch  # and no more than that


def test_default_shards_of_four_batches_or_more_are_held_two_at_a_time():
    assert shards_held(32, 128) == shards_held(512, 2048) == 2
    assert shards_held(34, 16) == 6  # the demo's 16-sample shards under a 34-sample batch
