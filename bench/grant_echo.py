"""The grant path's floor: a stand-in for ``antdt sharder`` that makes only its broker hops.

    .venv/bin/python bench/grant_echo.py   (settings from ANTDT_* variables; scale_bench.py
    --sharder echo runs it)

It reads shard requests as the sharder does (same consumer group, same low-latency consumer),
appends one log record per request and waits until the log is durable (the sharder's rule before any
answer), then produces a GRANTED answer through a second producer, as the sharder does: the request,
the log append and the answer are the three produce round trips of a real grant, with no state, no
decision and no snapshots. Grant latency measured against this process is what the broker and the
machine cost on their own; the real sharder can only add to it.
"""

from __future__ import annotations

import signal
import sys
from datetime import UTC, datetime
from itertools import count

from antdt.bus.clients import flush_or_raise, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.readers import poll_batch
from antdt.schemas.codec import make_codec
from antdt.schemas.models import (
    AssignmentStatus,
    ProgressKind,
    Shard,
    ShardAssignment,
    ShardProgress,
    trusted,
)
from antdt.services.sharder.service import LARGE_RECORDS
from antdt.settings import load_settings
from antdt.topics import topic_spec, worker_key


def answer_for(request: ShardProgress, shard_ids: count) -> ShardAssignment:
    shards = [
        trusted(Shard, shard_id=next(shard_ids), start=0, length=100, attempt=0, done=[])
        for _ in range(request.quota or 1)
    ]
    return trusted(
        ShardAssignment,
        job_id=request.job_id,
        worker_id=request.worker_id,
        seq=request.seq,
        writer_epoch=1,
        epoch=request.epoch,
        status=AssignmentStatus.GRANTED,
        shards=shards,
        lease_expires=None,
        quota=request.quota or 1,
        in_reply_to=request.seq,
        version=None,
        reason=None,
        timestamp=datetime.now(UTC),
    )


def main() -> None:
    settings = load_settings()
    codec = make_codec(settings.schema_registry_url)
    topic = lambda component, name: topic_spec(component, name).full_name(settings.topic_prefix)  # noqa: E731
    progress, log_topic, answers_topic = (
        topic("shard", "progress"),
        topic("shard", "log"),
        topic("shard", "assignments"),
    )
    # the log's, as the sharder's
    producer = make_producer(settings, client_id="grant-echo", **LARGE_RECORDS)
    answering = make_producer(settings, client_id="grant-echo-answers", **LARGE_RECORDS)
    consumer = make_consumer(
        settings, group_id=settings.group("sharder"), pace=FetchPace.LOW_LATENCY
    )
    consumer.subscribe([progress, topic("worker", "lifecycle")])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    shard_ids, announced = count(), False
    try:
        while True:
            answers = []
            for message in poll_batch(consumer, 2000, 0.05):
                if message.topic() != progress or not message.value():
                    continue
                request = codec.decode(message.value())
                if isinstance(request, ShardProgress) and request.kind is ProgressKind.REQUESTED:
                    answers.append(answer_for(request, shard_ids))
            if not announced and consumer.assignment():
                print("ready", flush=True)
                announced = True
            encoded = [
                (a.job_id, worker_key(a.job_id, a.worker_id), codec.encode(a, answers_topic))
                for a in answers
            ]
            # the log append (keyed by job, as the log is): one record per grant
            for job, _, value in encoded:
                producer.produce(log_topic, key=job.encode(), value=value)
            if encoded:
                flush_or_raise(producer)
            for _, key, value in encoded:
                answering.produce(answers_topic, key=key.encode(), value=value)
            answering.poll(0)
            if answers:
                consumer.commit(asynchronous=True)
    finally:
        consumer.close()
        flush_or_raise(answering)


if __name__ == "__main__":
    main()
