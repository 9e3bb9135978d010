"""Which commit reports an answer shows lost: those sent before the request whose grant is held,
samples missing."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from antdt.schemas.models import AssignmentStatus, Shard, ShardAssignment, ShardCommit
from antdt.worker.sent_commits import SentCommits


def answer(
    in_reply_to: int,
    held: dict[int, list[int]],
    status=AssignmentStatus.GRANTED,
    attempt: int = 0,
    epoch: int = 0,
) -> ShardAssignment:
    """An answer holding shard -> done samples (shards of 10 samples)."""
    shards = [
        Shard(shard_id=s, start=10 * s, length=10, attempt=attempt, done=done)
        for s, done in held.items()
    ]
    if status is not AssignmentStatus.GRANTED:
        shards = []
    return ShardAssignment(
        job_id="j",
        worker_id="w0",
        seq=1,
        writer_epoch=1,
        epoch=epoch,
        status=status,
        shards=shards,
        quota=2,
        in_reply_to=in_reply_to,
        timestamp=datetime.now(UTC),
    )


def commit(
    shard: int, samples: list[int], attempt: int = 0, holder: str | None = "w0"
) -> ShardCommit:
    return ShardCommit(holder=holder, shard_id=shard, attempt=attempt, samples=samples)


def test_a_commit_the_answer_shows_is_forgotten_and_one_it_lacks_is_sent_again():
    sent = SentCommits("w0")
    sent.add(3, b"c3", 0, [commit(1, [10, 11])])
    sent.add(4, b"c4", 0, [commit(1, [12])])
    assert sent.lost(answer(5, {1: [10, 11]}), last_seq=5) == [b"c4"]
    assert len(sent) == 1  # kept until an answer to a later request shows it
    # the same answer again: not after the repeat
    assert sent.lost(answer(5, {1: [10, 11]}), last_seq=5) == []
    assert sent.lost(answer(6, {1: [10, 11, 12]}), last_seq=6) == [] and len(sent) == 0


def test_commits_sent_after_the_request_wait_for_a_later_answer():
    sent = SentCommits("w0")
    sent.add(7, b"c7", 0, [commit(1, [10])])
    assert sent.lost(answer(5, {1: []}), last_seq=7) == [] and len(sent) == 1


def test_a_grant_no_longer_held_is_confirmed_whatever_its_samples():
    """DONE, reclaimed, refused (returned to TODO) or rewound (a new attempt): nothing to send
    again."""
    sent = SentCommits("w0")
    sent.add(1, b"a", 0, [commit(1, [10])])
    sent.add(2, b"b", 0, [commit(2, [20])])
    assert sent.lost(answer(3, {2: []}, attempt=1), last_seq=3) == [] and len(sent) == 0
    sent.add(4, b"c", 0, [commit(1, [10])])
    assert (
        sent.lost(answer(5, {}, status=AssignmentStatus.WAIT), last_seq=5) == [] and len(sent) == 0
    )


def test_a_refusal_says_nothing_about_what_is_held_and_other_holders_are_not_ours_to_check():
    sent = SentCommits("w0")
    sent.add(1, b"a", 0, [commit(1, [10])])
    sent.add(2, b"loader", 0, [commit(2, [20], holder="w0.loader0")])
    assert (
        sent.lost(answer(3, {}, status=AssignmentStatus.REFUSED), last_seq=3) == []
        and len(sent) == 1
    )
    assert sent.lost(answer(4, {1: [], 2: []}), last_seq=4) == [b"a"]


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sets(st.integers(0, 9), min_size=1), st.booleans()),
        min_size=1,
        max_size=20,
    )
)
def test_exactly_the_commits_whose_samples_did_not_arrive_are_sent_again(reports):
    """Reports (shard, samples, arrived): with every shard held, the ones that did not arrive come
    back."""
    sent = SentCommits("w0")
    done: dict[int, set[int]] = {s: set() for s in range(4)}
    for seq, (shard, samples, arrived) in enumerate(reports, start=1):
        sent.add(
            seq, str(seq).encode(), 0, [commit(shard, sorted(10 * shard + i for i in samples))]
        )
        if arrived:
            done[shard] |= {10 * shard + i for i in samples}
    again = sent.lost(
        answer(len(reports) + 1, {s: sorted(d) for s, d in done.items()}), last_seq=len(reports) + 1
    )
    expected = [
        str(seq).encode()
        for seq, (shard, samples, _) in enumerate(reports, start=1)
        if not {10 * shard + i for i in samples} <= done[shard]
    ]
    assert again == expected
