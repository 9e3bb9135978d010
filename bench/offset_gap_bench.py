"""Offsets a tailing reader is handed past on the embedded broker, with and without the gap guard.

    .venv/bin/python bench/offset_gap_bench.py [--json] [--producers 8] [--rounds 1000] [--busy 3]

Eight producers append in bursts to one partition (all at once, as the
ranks of a synchronous job commit after a step) while a group consumer
tails it through ``poll_batch``; ``--busy`` processes spin beside them (the
holes come under load). Then a fresh reader reads the partition from the
start. Reported per reader kind: offsets the tailing reader never got that
the partition holds (``skipped``), and, for the guarded one, the holes it
read again (``refilled``) or gave up on (``accepted``). Exits 1 if the
guarded reader skipped anything.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time

from benchlib import embedded_broker, emit, fresh_settings
from confluent_kafka import Consumer, TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace, consumer_config
from antdt.bus.readers import poll_batch
from antdt.topics import topic_spec

READ_FOR_S = 90.0


def spin(stop) -> None:
    while not stop.is_set():
        pass


def produce_in_bursts(settings, topic: str, producers: int, rounds: int) -> None:
    barrier = threading.Barrier(producers)

    def one(k: int) -> None:
        producer = make_producer(settings, client_id=f"burst-{k}", **{"linger.ms": 0})
        for r in range(rounds):
            barrier.wait()
            producer.produce(topic, key=b"job", value=f"{k}:{r}".encode(), partition=0)
            producer.flush(10)
            time.sleep(0.005)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def tail(consumer, topic: str, total: int, seen: list[int]) -> None:
    """Tail the partition until its last offset (``total - 1``) came, or READ_FOR_S after the first
    record."""
    consumer.subscribe([topic])
    deadline = None
    while not seen or (seen[-1] < total - 1 and time.monotonic() < deadline):
        got = poll_batch(consumer, 500, 0.1)
        seen += [m.offset() for m in got]
        if got and deadline is None:
            deadline = time.monotonic() + READ_FOR_S


def read_all(settings, topic: str, total: int) -> set[int]:
    """Every offset the partition holds, read from the start by a plain reader (up to
    READ_FOR_S)."""
    consumer = make_consumer(settings)
    consumer.assign([TopicPartition(topic, 0, 0)])
    offsets, started = set(), time.monotonic()
    while len(offsets) < total and time.monotonic() - started < READ_FOR_S:
        offsets |= {m.offset() for m in consumer.consume(1000, 0.5) if not m.error()}
    consumer.close()
    return offsets


def one_run(guarded: bool, producers: int, rounds: int) -> dict:
    with embedded_broker() as broker:
        settings = fresh_settings(broker)
        topic = topic_spec("shard", "progress").full_name(settings.topic_prefix)
        if guarded:
            consumer = make_consumer(
                settings, group_id=f"{settings.topic_prefix}.tail", pace=FetchPace.LOW_LATENCY
            )
        else:
            consumer = Consumer(
                consumer_config(
                    settings, f"{settings.topic_prefix}.tail", pace=FetchPace.LOW_LATENCY
                )
            )
        seen: list[int] = []
        total = producers * rounds
        reader = threading.Thread(target=tail, args=(consumer, topic, total, seen))
        reader.start()
        time.sleep(3.0)  # joined and fetching
        produce_in_bursts(settings, topic, producers, rounds)
        reader.join()
        held = read_all(settings, topic, total)
        gaps = getattr(consumer, "gaps", None)
        consumer.close()
        got = set(seen)
        last = max(got) if got else -1
        result = {
            "reader": "guarded" if guarded else "plain",
            "records": total,
            "read_back": len(held),
            "tail_read": len(got),
            "skipped": sorted(o for o in held if o < last and o not in got),
        }
        if gaps is not None:
            result |= {"refilled": gaps.holes_refilled, "accepted": gaps.holes_accepted}
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--busy", type=int, default=3, help="spinning processes beside the run")
    args = parser.parse_args()
    stop = multiprocessing.Event()
    spinners = [
        multiprocessing.Process(target=spin, args=(stop,), daemon=True) for _ in range(args.busy)
    ]
    for process in spinners:
        process.start()
    try:
        runs = [one_run(guarded, args.producers, args.rounds) for guarded in (False, True)]
    finally:
        stop.set()
    report = {"producers": args.producers, "rounds": args.rounds, "busy": args.busy, "runs": runs}
    emit(report, args.json)
    failed = runs[1]["skipped"]
    if failed:
        print(f"FAILED: the guarded reader skipped offsets {failed[:10]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
