"""An epoch's tail pooled among the ranks: shares by batch size, every position once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from antdt.errors import AntdtError
from antdt.worker.dataset import ShardGrant
from antdt.worker.elastic.pooling import Offer, share_of, shares


@given(st.integers(0, 10_000), st.lists(st.integers(0, 600), min_size=1, max_size=16))
def test_shares_add_up_and_follow_the_batch_sizes_within_one_sample(total, weights):
    if not sum(weights):
        with pytest.raises(AntdtError, match="a rank with a batch"):
            shares(total, weights)
        return
    parts = shares(total, weights)
    assert sum(parts) == total
    for part, weight in zip(parts, weights, strict=True):
        assert abs(part - total * weight / sum(weights)) < 1
        assert weight or not part


runs = st.lists(
    st.tuples(st.integers(0, 5), st.integers(1, 40)), max_size=4
)  # (shard id, length) per run


@given(st.lists(st.tuples(st.integers(1, 64), runs), min_size=1, max_size=6))
def test_every_pooled_position_goes_to_exactly_one_rank_under_its_own_grant(ranks):
    offers, expected, next_position = [], [], 0
    for rank, (batch, shape) in enumerate(ranks):
        offered = []
        for shard_id, length in shape:
            positions = list(range(next_position, next_position + length))
            next_position += length
            offered.append(ShardGrant(0, shard_id, rank, f"r{rank}", positions))
            expected.extend((shard_id, rank, f"r{rank}", p) for p in positions)
        offers.append(Offer(batch, tuple(offered)))
    taken = [
        (grant.shard_id, grant.attempt, grant.holder, position)
        for rank in range(len(offers))
        for grant in share_of(offers, rank)
        for position in grant.positions
    ]
    assert taken == expected  # each once, in the order offered, with its grant's identity
    total = sum(offer.samples for offer in offers)
    for rank in range(len(offers)):
        mine = sum(len(grant.positions) for grant in share_of(offers, rank))
        assert mine == shares(total, [o.batch_size for o in offers])[rank]


def test_a_straggler_s_tail_is_split_three_to_one_with_a_rank_three_times_its_batch():
    tail = ShardGrant(0, 7, 1, "slow", list(range(100, 180)))
    offers = [Offer(384, ()), Offer(128, (tail,))]
    fast, slow = share_of(offers, 0), share_of(offers, 1)
    assert [len(g.positions) for g in fast] == [60] and [len(g.positions) for g in slow] == [20]
    assert fast[0].holder == slow[0].holder == "slow"  # committed under the holder's grant
    assert fast[0].positions + slow[0].positions == tail.positions
