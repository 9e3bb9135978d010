"""The group history's summary: what an operator reads after a run."""

from __future__ import annotations

from antdt.schemas.models import GroupFormed, GroupReason
from antdt.services.grouper.history import summary


def copy(generation: int, group_id: int, reason: GroupReason, worker: str) -> GroupFormed:
    return GroupFormed(
        job_id="job",
        worker_id=worker,
        group_id=group_id,
        generation=generation,
        reason=reason,
        members=["w0", "w1"],
        ranks=[0, 1],
        in_reply_to=1,
        waited_ms=5,
        timestamp=1_000 * generation + group_id,
    )


def test_a_final_average_redone_after_a_restart_counts_once_in_each_generation():
    copies = [
        copy(gen, gid, reason, worker)
        for gen, gid, reason in [
            (1, 1, GroupReason.QUORUM),
            (1, 2, GroupReason.FINAL),
            (2, 1, GroupReason.QUORUM),
            (2, 2, GroupReason.FINAL),
        ]
        for worker in ("w0", "w1")  # a copy per member is still one group
    ]
    figures = summary(copies)
    assert figures["finals_by_generation"] == {"1": 1, "2": 1}
    assert figures["by_reason"]["FINAL"] == 2 and figures["groups"] == 4
