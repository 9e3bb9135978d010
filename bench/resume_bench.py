"""A reply reader resumed after a pause: how long until it reads the reply that came meanwhile.

    .venv/bin/python bench/resume_bench.py [--replies 12] [--paused-s 0.3] [--json]

A worker's reply readers (its shard grants, its partial-reduce groups) pause
their partition while no reply is awaited (antdt.bus.own_key) and resume it
with the next request. librdkafka starts fetching a resumed partition only
when its broker thread next wakes on its own; ``wake_fetcher`` seeks the
partition to where the reader stands, which wakes it. For each way, one
reader on the embedded broker, configured as a worker's grant reader: pause,
a reply written while paused, resume, and the time until the reply is polled.
The two ways alternate, reply by reply.
"""

from __future__ import annotations

import time

from benchlib import distribution, embedded_broker, emit, fresh_settings
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace, collected_late
from antdt.bus.own_key import wake_fetcher

WAYS = ("resume", "resume+wake")
READ_WITHIN_S = 10.0


def read_one(reader, began: float) -> float | None:
    """Seconds from ``began`` until ``reader`` polls a record; None past READ_WITHIN_S."""
    while time.perf_counter() - began < READ_WITHIN_S:
        message = reader.poll(0.005)
        if message is not None and message.error() is None:
            return time.perf_counter() - began
    return None


def measure(settings, replies: int, paused_s: float) -> dict[str, list]:
    topic = settings.topic("shard", "assignments")
    producer = make_producer(settings, **{"linger.ms": 0})
    readers = {
        way: make_consumer(
            settings, pace=FetchPace.STEADY, **collected_late(settings, FetchPace.STEADY)
        )
        for way in WAYS
    }
    # a fresh prefix: each reader reads its own empty partition from the start
    partitions = {
        way: [TopicPartition(topic, index, OFFSET_BEGINNING)] for index, way in enumerate(WAYS)
    }
    latencies: dict[str, list] = {way: [] for way in WAYS}
    try:
        for way, reader in readers.items():
            reader.assign(partitions[way])
            producer.produce(topic, value=b"first", partition=partitions[way][0].partition)
            producer.flush(10)
            if read_one(reader, time.perf_counter()) is None:
                raise SystemExit(f"resume bench FAILED: {way}'s reader read nothing")
        for _ in range(replies):
            for way, reader in readers.items():
                reader.pause(partitions[way])
                time.sleep(paused_s)
                producer.produce(topic, value=b"reply", partition=partitions[way][0].partition)
                producer.flush(10)
                began = time.perf_counter()
                reader.resume(partitions[way])
                if way == "resume+wake":
                    wake_fetcher(reader, partitions[way])
                latencies[way].append(read_one(reader, began))
    finally:
        for reader in readers.values():
            reader.close()
    return latencies


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=12)
    parser.add_argument("--paused-s", type=float, default=0.3, help="how long each pause lasts")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    if args.replies < 1 or args.paused_s < 0:
        parser.error("--replies must be at least 1 and --paused-s not negative")
    with embedded_broker() as broker:
        latencies = measure(fresh_settings(broker), args.replies, args.paused_s)
    lost = {way: sum(value is None for value in values) for way, values in latencies.items()}
    emit(
        {
            "paused_s": args.paused_s,
            "read_after_resume_ms": {
                way: distribution([v * 1000 for v in values if v is not None], 1)
                for way, values in latencies.items()
            },
            "unread": lost,
        },
        args.json,
    )
    if any(lost.values()):
        raise SystemExit(f"resume bench FAILED: replies unread within {READ_WITHIN_S:.0f} s")


if __name__ == "__main__":
    main()
