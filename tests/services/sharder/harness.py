"""Running the sharder and simulated workers against the real embedded broker."""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager

from antdt.bus.clients import make_producer
from antdt.runtime.launch import service_process
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import AssignmentStatus, DatasetSpec
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.audit import audit_log
from antdt.services.sharder.eventlog import LogReads
from antdt.services.sharder.service import SharderConfig, SharderService
from antdt.services.sharder.state import JobState
from antdt.settings import Settings
from antdt.worker.shard_client import NoAnswer, ShardClient
from tests.services.running import running_loop


def running_sharder(
    settings: Settings, config: SharderConfig | None = None, writer_id: str | None = None
):
    """A SharderService on a background thread, stopped (and flushed) on exit (see
    :func:`running_loop`)."""
    return running_loop(SharderService(settings, config, writer_id), "sharder")


@contextmanager
def sharder_process(settings: Settings, *extra: str):
    """``antdt sharder`` as its own process, the way it is deployed; yields the Popen."""
    with service_process(settings, "sharder", *extra) as service:
        yield service.process


def work_until_finished(client: ShardClient, deadline_s: float = 120.0, on_shard=None) -> int:
    """Request, 'train', report DONE until the job is finished; tolerant of sharder outages."""
    epoch, finished_shards = 0, 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            answer = client.request(epoch, quota=2, timeout_s=2.0)
        except NoAnswer:
            continue  # the sharder is down or taking over; ask again
        if answer.status is AssignmentStatus.FINISHED:
            return finished_shards
        if answer.status is AssignmentStatus.EPOCH_END:
            epoch += 1
            continue
        if answer.status is AssignmentStatus.WAIT:
            if answer.epoch > epoch:
                epoch = answer.epoch
            time.sleep(0.01)
            continue
        for shard in answer.shards:
            if on_shard is not None:
                on_shard(client.worker_id, shard)
            client.done(answer.epoch, shard.shard_id, shard.attempt)
            finished_shards += 1
    raise AssertionError(f"{client.worker_id} did not finish within {deadline_s:.0f} s")


def run_workers(
    settings: Settings, job_id: str, spec: DatasetSpec, count: int, on_shard=None
) -> dict[str, int]:
    """``count`` worker threads until the job is finished; shards each reported done."""
    results: dict[str, int] = {}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with ShardClient(settings, job_id, name, spec) as client:
                results[name] = work_until_finished(client, on_shard=on_shard)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    if errors:
        raise errors[0]
    return results


def job_log(settings: Settings, job_id: str) -> list:
    producer = make_producer(settings)
    try:
        reads = LogReads(settings, SingleObjectCodec(), producer)
        return [event for _, event in reads.job_log(job_id)]
    finally:
        producer.flush(5)


def accepted_done_counts(job_id: str, events) -> tuple[Counter, JobState]:
    """DONE events the fold accepts, per (epoch, shard), and the folded state."""
    state = JobState(job_id)
    counts: Counter = Counter()
    for event in events:
        if state.apply(event) and event.transition is T.DONE:
            counts[(event.epoch, event.shard_id)] += 1
    return counts, state


def assert_exactly_once(job_id: str, spec: DatasetSpec, events) -> JobState:
    """Both the fold and the independent audit agree: every sample exactly once per epoch."""
    report = audit_log(events, job_id)
    assert report.ok and report.finished, report.violations
    assert [e.samples_done_once for e in report.epochs] == [spec.size] * spec.epochs
    counts, state = accepted_done_counts(job_id, events)
    expected = {
        (epoch, shard): 1 for epoch in range(spec.epochs) for shard in range(spec.shard_count)
    }
    assert dict(counts) == expected, (
        f"DONE counts differ: {sorted(set(counts.items()) ^ set(expected.items()))[:10]}"
    )
    assert state.finished
    return state
