"""Reading the groups back: ``group.formed`` says who averaged with whom, when and why.

Each group is on the bus once per member (keyed by member): :func:`read_copies`
reads them all, :func:`one_per_group` folds them into one per group, and
:func:`summary` gives what an operator asks first: how many groups and why,
how big, how long members waited, and how often each worker joined one.
"""

from __future__ import annotations

import statistics
from collections import Counter

from antdt.bus.readers import read_whole_topic
from antdt.schemas.codec import Codec
from antdt.schemas.models import WHOLE_GROUP_REASONS, GroupFormed, GroupReason
from antdt.settings import Settings


def read_copies(settings: Settings, codec: Codec, job_id: str) -> list[GroupFormed]:
    """Every member's copy of the job's groups."""
    return list(
        read_whole_topic(settings, codec, settings.topic("group", "formed"), GroupFormed, job_id)
    )


def one_per_group(copies: list[GroupFormed]) -> list[GroupFormed]:
    """One copy per (generation, group id), in formation order."""
    first: dict[tuple[int, int], GroupFormed] = {}
    for record in copies:
        first.setdefault((record.generation, record.group_id), record)
    return sorted(first.values(), key=lambda g: (g.timestamp, g.generation, g.group_id))


def summary(copies: list[GroupFormed]) -> dict:
    """Counts by reason, sizes, member waits (ms, median and p99) and groups per worker.

    ``finals_by_generation`` counts the FINAL groups of each generation: a group restarted from
    its checkpoint after its final average forms that average again in its next generation, so
    the whole run may hold several, but one generation never more than one.
    """
    groups = one_per_group(copies)
    waits = sorted(c.waited_ms for c in copies)
    partial = [len(g.members) for g in groups if g.reason not in WHOLE_GROUP_REASONS]
    per_worker: dict[str, int] = {}
    for group in groups:
        for member in group.members:
            per_worker[member] = per_worker.get(member, 0) + 1
    return {
        "groups": len(groups),
        "by_reason": {
            reason.value: sum(1 for g in groups if g.reason is reason) for reason in GroupReason
        },
        "finals_by_generation": finals_by_generation(groups),
        "mean_partial_size": round(statistics.fmean(partial), 3) if partial else None,
        "wait_ms_p50": waits[len(waits) // 2] if waits else None,
        "wait_ms_p99": waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else None,
        "per_worker": dict(sorted(per_worker.items())),
    }


def finals_by_generation(groups: list[GroupFormed]) -> dict[str, int]:
    """How many FINAL groups each generation formed (keys are strings: the summary is JSON)."""
    return dict(Counter(str(g.generation) for g in groups if g.reason is GroupReason.FINAL))
