"""Recovering a job's shard state, and taking over as its one writer.

Recovery is the latest snapshot plus the log after it; catching up is proven
with a marker, never with the high watermark. Taking over then appends a
WRITER_ELECTED with a higher writer epoch and reads the log again up to and
including it, folding whatever a previous writer managed to append in
between, so this writer's state is exactly the fold of the log, and every
later event from an older writer is ignored by every reader.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING

from antdt.errors import BusError
from antdt.services.sharder.core import CoreConfig, ShardCore
from antdt.services.sharder.eventlog import LogReads, LogWriter
from antdt.services.sharder.state import JobState


@dataclass
class Recovered:
    """A job's state as rebuilt, and what it took."""

    state: JobState
    last_offset: int | None
    from_snapshot: bool
    events_replayed: int
    seconds: float


def recover_job(reads: LogReads, job_id: str, use_snapshots: bool = True) -> Recovered:
    """Latest snapshot (if any) plus every log event after it."""
    started = time.perf_counter()
    snapshot = reads.latest_snapshot(job_id) if use_snapshots else None
    state = JobState.from_snapshot(snapshot) if snapshot else JobState(job_id)
    last_offset = snapshot.log_offset if snapshot else None
    start = last_offset + 1 if last_offset is not None else OFFSET_BEGINNING
    replayed = 0
    for offset, event in reads.job_log(job_id, start):
        state.apply(event)
        last_offset, replayed = offset, replayed + 1
    return Recovered(
        state, last_offset, snapshot is not None, replayed, time.perf_counter() - started
    )


def held_state(state: JobState, last_offset: int) -> Recovered:
    """A state held in memory, which is the fold of the log up to ``last_offset``, as a recovery's
    base."""
    return Recovered(state, last_offset, from_snapshot=False, events_replayed=0, seconds=0.0)


def take_over(
    reads: LogReads,
    job_id: str,
    log: LogWriter,
    writer: str,
    config: CoreConfig,
    now_ms: int,
    use_snapshots: bool = True,
    known: Recovered | None = None,
) -> tuple[ShardCore, Recovered]:
    """Recover the job and become its writer (fencing every older writer).

    ``known`` is a state this writer holds that is the fold of the log up to its
    ``last_offset`` (see :func:`held_state`): it stands in for the snapshot and
    the log before that offset, whose reading and decoding cost most of a
    take-over; whatever follows it is folded in as always.
    """
    recovered = known or recover_job(reads, job_id, use_snapshots)
    core = ShardCore(recovered.state, config)
    election = core.election_event(recovered.state.writer_epoch + 1, now_ms, writer)
    log.append([election])
    log.flush()
    start = recovered.last_offset + 1 if recovered.last_offset is not None else OFFSET_BEGINNING
    for offset, event in reads.job_log(job_id, start):
        recovered.state.apply(event)
        recovered.last_offset = offset
        recovered.events_replayed += 1
    if recovered.state.writer != election.reason:
        raise BusError(
            f"lost the election for job {job_id} to {recovered.state.writer} "
            f"(epoch {recovered.state.writer_epoch})"
        )
    return core, recovered
