"""What a run that outlived its bound was waiting for: the sharder's view of the job and each
worker's last phase.

A demo or chaos run that does not finish within its bound is a stall, and a
stall must say where it is (issue 38: never a silent one). The bound's
error names the shards that keep the epoch open (their state, holder and
lease), recovered from the shard log the way a sharder taking the job over
recovers it, and ``stall.json`` in the run folder holds the whole picture
with the workers' phases, beside the logs.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from antdt.schemas.models import ShardState
from antdt.services.sharder.state import JobState

#: Open shards listed one by one in ``stall.json`` (the rest are counted).
LISTED = 40


def stall_summary(state: JobState, now_ms: int) -> dict:
    """The job as the shard log has it: its epoch, writer, shards by state, the open ones (not done)
    with their holders and leases, and what each worker holds."""
    open_slots = [slot for slot in state.slots if slot.state is not ShardState.DONE]
    return {
        "job_id": state.job_id,
        "epoch": state.epoch,
        "finished": state.finished,
        "writer": state.writer,
        "writer_epoch": state.writer_epoch,
        "last_seq": state.last_seq,
        "shards": dict(Counter(slot.state.value for slot in state.slots)),
        "open": [
            {
                "shard": slot.shard_id,
                "state": slot.state.value,
                "worker": slot.worker,
                "attempt": slot.attempt,
                "started": slot.started,
                "lease_left_s": None
                if slot.lease_ms is None
                else round((slot.lease_ms - now_ms) / 1000, 1),
                "applied": len(slot.applied),
                "length": slot.length,
            }
            for slot in open_slots[:LISTED]
        ],
        "held": {worker: sorted(ids) for worker, ids in sorted(state.held.items()) if ids},
        "quotas": dict(sorted(state.quotas.items())),
    }


def one_line(summary: dict) -> str:
    """The summary as the bound's error says it."""
    if summary["finished"]:
        return f"the shard log has job {summary['job_id']} finished"
    shards = summary["shards"]
    counts = ", ".join(f"{shards[s.value]} {s.value}" for s in ShardState if s.value in shards)
    # from what each worker holds, not the open list: that one stops at LISTED shards
    held = ", ".join(f"{worker}: {len(ids)}" for worker, ids in summary["held"].items())
    return (
        f"the shard log has epoch {summary['epoch']} open with {counts or 'no shards'}"
        + (f" (doing: {held})" if held else "")
        + f", written by {summary['writer']} (epoch {summary['writer_epoch']})"
    )


def describe_stall(
    settings, job_id: str, run_dir: Path, phases: dict[str, str], counters: dict | None = None
) -> str:
    """Write ``stall.json`` (the sharder's view, recovered from the bus, the workers' phases and
    the services' own counters: did the grouper read announcements, form groups?) and return its
    one line; a bus that cannot say is said too."""
    from antdt.bus.clients import make_producer
    from antdt.schemas.codec import make_codec
    from antdt.services.sharder.eventlog import LogReads
    from antdt.services.sharder.recovery import recover_job

    report: dict = {"phases": phases, "services": counters or {}}
    try:
        codec = make_codec(settings.schema_registry_url)
        recovered = recover_job(LogReads(settings, codec, make_producer(settings)), job_id)
        report["sharder"] = stall_summary(recovered.state, int(time.time() * 1000))
        line = one_line(report["sharder"])
    except Exception as exc:  # noqa: BLE001 - the bound's error must still be raised
        report["sharder"] = None
        line = f"the shard log could not be read ({exc})"
    (run_dir / "stall.json").write_text(json.dumps(report, indent=1))
    return line
