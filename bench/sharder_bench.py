"""Sharder figures: core and service transitions/s, grant latency, recovery time.

    .venv/bin/python bench/sharder_bench.py [--json] [--only core,service,latency,recovery]
        [--recovery-events 1000000] [--service-seconds 10]

* core: the pure state machine, in memory: workers request and finish shards
  as fast as the core can decide (every decision is a log event); and the
  process's RSS at the end, holding the whole epoch with every sample applied.
* service: ``antdt sharder`` as its own process on the embedded broker, fed
  by a closed-loop load generator (many simulated workers, each holding a
  quota of shards, reporting DONE and asking again as soon as it is
  answered). Transitions/s = log events appended / wall time, read back from
  the log itself.
* latency: one worker, request -> assignment received, each request waiting
  for its answer (the sharder otherwise idle).
* recovery: a log of N events (written by the core, snapshots every 10,000
  events), then the time to recover the job with and without snapshots.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import psutil
from benchlib import bench_parser, distribution, embedded_broker, emit, fresh_settings
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.markers import marker_id
from antdt.bus.readers import assign_now, poll_batch
from antdt.runtime.launch import service_process
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import AssignmentStatus, DatasetSpec, ProgressKind, ShardProgress, trusted
from antdt.schemas.types import utc_now
from antdt.services.sharder.core import CoreConfig, ShardCore
from antdt.services.sharder.eventlog import LogReads, LogWriter, log_topic, snapshot_topic
from antdt.services.sharder.recovery import recover_job
from antdt.services.sharder.state import JobState
from antdt.settings import Settings
from antdt.topics import topic_spec
from antdt.worker.shard_client import ShardClient

# ---------------------------------------------------------------- core


def simulate(
    core: ShardCore,
    workers: int,
    now_ms: int = 0,
    stop_after_events: int | None = None,
    on_events=None,
) -> int:
    """Workers cycle request -> done until the job finishes (or enough events); returns events."""
    total, seq = 0, 0
    names = [f"w{i}" for i in range(workers)]

    def report(kind, worker, **fields):
        nonlocal seq
        seq += 1
        return trusted(
            ShardProgress,
            job_id=core.state.job_id,
            worker_id=worker,
            incarnation="bench",
            seq=seq,
            kind=kind,
            epoch=fields.pop("epoch", core.state.epoch),
            shard_id=fields.pop("shard_id", None),
            step=None,
            error=None,
            attempt=fields.pop("attempt", None),
            quota=fields.pop("quota", None),
            dataset=fields.pop("dataset", None),
            version=None,
            timestamp=None,
        )

    while not core.state.finished:
        for worker in names:
            outcome = core.on_progress(report(ProgressKind.REQUESTED, worker), now_ms)
            events = list(outcome.events)
            for shard in outcome.assignment.shards:
                started = core.on_progress(
                    report(
                        ProgressKind.STARTED, worker, shard_id=shard.shard_id, attempt=shard.attempt
                    ),
                    now_ms,
                )
                done = core.on_progress(
                    report(
                        ProgressKind.DONE, worker, shard_id=shard.shard_id, attempt=shard.attempt
                    ),
                    now_ms,
                )
                events += started.events + done.events
            total += len(events)
            if on_events is not None:
                on_events(events)
            if stop_after_events and total >= stop_after_events:
                return total
        now_ms += 1
    return total


def bench_core() -> dict:
    spec = DatasetSpec(
        name="bench",
        size=2_000_000,
        shard_size=10,
        epochs=1,
        shuffle_seed=1,
        max_attempts=3,
        lease_s=60,
    )
    core = ShardCore(JobState("bench"), CoreConfig(default_quota=4))
    core.elect(1, 0, "bench")
    core.on_progress(
        ShardProgress(
            job_id="bench",
            worker_id="w0",
            incarnation="b",
            seq=0,
            kind=ProgressKind.REQUESTED,
            epoch=0,
            dataset=spec,
            timestamp=utc_now(),
        ),
        0,
    )
    started = time.perf_counter()
    events = simulate(core, workers=64)
    seconds = time.perf_counter() - started
    return {
        "transitions": events,
        "seconds": round(seconds, 3),
        "transitions_per_s": round(events / seconds),
        "shards": spec.shard_count,
        "samples": spec.size,
        "workers": 64,
        # the process holding the whole epoch, every sample applied
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20),
    }


# ---------------------------------------------------------------- service


def bench_service(settings: Settings, seconds: float, workers: int = 200, quota: int = 16) -> dict:
    """Closed-loop load: every answer is turned at once into DONEs and a new request."""
    job = "svc-bench"
    spec = DatasetSpec(
        name="bench",
        size=200_000,
        shard_size=10,
        epochs=100,
        shuffle_seed=1,
        max_attempts=3,
        lease_s=600,
    )
    codec = SingleObjectCodec()
    progress = topic_spec("shard", "progress").full_name(settings.topic_prefix)
    assignments = topic_spec("shard", "assignments").full_name(settings.topic_prefix)
    sharder = ExitStack()
    sharder.enter_context(service_process(settings, "sharder"))
    producer = make_producer(settings, **{"linger.ms": 2})
    consumer = make_consumer(settings, pace=FetchPace.LOW_LATENCY)
    assign_now(
        consumer,
        [
            TopicPartition(assignments, p, OFFSET_BEGINNING)
            for p in range(topic_spec("shard", "assignments").partitions)
        ],
    )
    seq = 0
    now = utc_now()

    def send(kind, worker, **fields):
        nonlocal seq
        seq += 1
        report = trusted(
            ShardProgress,
            job_id=job,
            worker_id=worker,
            incarnation="bench",
            seq=seq,
            kind=kind,
            epoch=fields.pop("epoch", 0),
            shard_id=fields.pop("shard_id", None),
            step=None,
            error=None,
            attempt=fields.pop("attempt", None),
            quota=fields.pop("quota", None),
            dataset=fields.pop("dataset", None),
            version=None,
            timestamp=now,
        )
        producer.produce(progress, key=job.encode(), value=codec.encode(report, progress))

    try:
        for i in range(workers):
            send(ProgressKind.REQUESTED, f"w{i}", quota=quota, dataset=spec)
        producer.flush(10)
        answered = 0
        started = None
        # the sharder process starts, joins its group, takes the job over
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up and (
            started is None or time.monotonic() - started < seconds
        ):
            for message in poll_batch(consumer, 5000, 0.05):
                if marker_id(message) is not None:
                    continue
                answer = codec.decode(message.value())
                started = started or time.monotonic()
                if answer.status is AssignmentStatus.FINISHED:
                    continue
                for shard in answer.shards:
                    send(
                        ProgressKind.DONE,
                        answer.worker_id,
                        shard_id=shard.shard_id,
                        attempt=shard.attempt,
                        epoch=answer.epoch,
                    )
                send(
                    ProgressKind.REQUESTED,
                    answer.worker_id,
                    epoch=answer.epoch
                    if answer.status is not AssignmentStatus.EPOCH_END
                    else answer.epoch + 1,
                )
                answered += 1
            producer.poll(0)
    finally:
        producer.flush(10)
        sharder.close()
    events = [e for _, e in LogReads(settings, codec, producer).job_log(job)]
    window = (events[-1].timestamp - events[0].timestamp).total_seconds()
    return {
        "transitions": len(events),
        "seconds": round(window, 3),
        "transitions_per_s": round(len(events) / window),
        "simulated_workers": workers,
        "quota": quota,
        "answers": answered,
    }


# ---------------------------------------------------------------- latency


def bench_latency(settings: Settings, requests: int = 1000) -> dict:
    spec = DatasetSpec(
        name="lat",
        size=1_000_000,
        shard_size=10,
        epochs=1,
        shuffle_seed=1,
        max_attempts=3,
        lease_s=600,
    )
    samples = []
    with service_process(settings, "sharder"):
        with ShardClient(settings, "lat-bench", "w0", spec) as client:
            # the sharder takes the job over on first sight
            client.request(0, quota=1, timeout_s=30)
            for _ in range(requests):
                began = time.perf_counter()
                answer = client.request(0, quota=1)
                samples.append((time.perf_counter() - began) * 1000)
                for shard in answer.shards:
                    client.done(0, shard.shard_id, shard.attempt)
    return {"requests": requests, "latency_ms": distribution(samples, digits=2)}


# ---------------------------------------------------------------- recovery


def write_log(settings: Settings, job: str, target_events: int, snapshot_every: int) -> int:
    """A realistic log of ``target_events`` events (with periodic snapshots) straight from the
    core."""
    codec = SingleObjectCodec()
    producer = make_producer(
        settings,
        **{"linger.ms": 20, "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000},
    )
    writer = LogWriter(producer, log_topic(settings), codec)
    spec = DatasetSpec(
        name="recovery",
        size=200_000,
        shard_size=10,
        epochs=1000,
        shuffle_seed=1,
        max_attempts=3,
        lease_s=600,
    )
    core = ShardCore(JobState(job), CoreConfig(default_quota=4))
    writer.append([core.elect(1, 0, "bench")])
    defined = core.on_progress(
        ShardProgress(
            job_id=job,
            worker_id="w0",
            incarnation="b",
            seq=0,
            kind=ProgressKind.REQUESTED,
            epoch=0,
            dataset=spec,
            quota=0,
            timestamp=utc_now(),
        ),
        0,
    )
    writer.append(defined.events)
    pending = {"since_snapshot": 0}

    def on_events(events):
        writer.append(events)
        pending["since_snapshot"] += len(events)
        if pending["since_snapshot"] >= snapshot_every:
            writer.flush(60)
            snapshot = core.state.to_snapshot(utc_now(), log_offset=writer.last_offset[job])
            producer.produce(
                snapshot_topic(settings), key=job.encode(), value=codec.encode(snapshot)
            )
            pending["since_snapshot"] = 0

    total = simulate(
        core, workers=32, now_ms=1, stop_after_events=target_events, on_events=on_events
    )
    writer.flush(120)
    return total + 1 + len(defined.events)


def bench_recovery(settings: Settings, events: int) -> dict:
    job = "recovery-bench"
    started = time.perf_counter()
    written = write_log(settings, job, events, snapshot_every=10_000)
    write_seconds = time.perf_counter() - started
    producer = make_producer(settings)
    codec = SingleObjectCodec()
    result = {"log_events": written, "write_seconds": round(write_seconds, 1)}
    for use_snapshots in (True, False):
        recovered = recover_job(LogReads(settings, codec, producer), job, use_snapshots)
        key = "with_snapshots" if use_snapshots else "without_snapshots"
        result[key] = {
            "seconds": round(recovered.seconds, 3),
            "events_replayed": recovered.events_replayed,
            "from_snapshot": recovered.from_snapshot,
        }
    return result


def main() -> None:
    parser = bench_parser(__doc__, "core,service,latency,recovery")
    parser.add_argument("--recovery-events", type=int, default=1_000_000)
    parser.add_argument("--service-seconds", type=float, default=10.0)
    args = parser.parse_args()
    parts = set(args.only.split(","))
    report: dict = {}
    if "core" in parts:
        report["core"] = bench_core()
    with embedded_broker() as broker:
        for part, run in (
            ("service", lambda s: bench_service(s, args.service_seconds)),
            ("latency", bench_latency),
            ("recovery", lambda s: bench_recovery(s, args.recovery_events)),
        ):
            if part in parts:
                report[part] = run(fresh_settings(broker))
    emit(report, args.json)


if __name__ == "__main__":
    main()
