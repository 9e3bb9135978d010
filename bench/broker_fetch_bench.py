"""The embedded broker's fetch wait: what each consumer's polling costs the broker, and what a
record waits.

    .venv/bin/python bench/broker_fetch_bench.py [--waits 5,10,50,100,500] [--consumers 5]
    [--records 40] [--json]

For each ``fetch.wait.max.ms``: ``--consumers`` consumers with nothing to
read poll every partition of one topic; the broker's CPU over 4 s is the
price of their polling. Then one record at a time is produced and read back
by one of them: produce-to-consume latency. Apache Kafka answers a waiting
fetch as soon as a record arrives, so its latency does not depend on the
wait; a broker that holds every fetch for the whole wait makes the latency
about half the wait, and only a short wait (many polls, broker CPU) keeps
it low.
"""

from __future__ import annotations

import threading
import time

import psutil
from benchlib import cpu_seconds, distribution, embedded_broker, emit, fresh_settings, numbers
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from antdt.topics import topic_spec


def poll_until(reader: Consumer, stop: threading.Event) -> None:
    while not stop.is_set():
        reader.poll(0.05)


def measure(
    bootstrap: str,
    topic: str,
    partitions: int,
    broker: psutil.Process,
    wait_ms: int,
    consumers: int,
    records: int,
) -> dict:
    readers = [
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"fetch-bench-{wait_ms}-{i}",
                "fetch.wait.max.ms": wait_ms,
                "enable.auto.commit": False,
            }
        )
        for i in range(consumers)
    ]
    for reader in readers:
        reader.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
    stop = threading.Event()
    pollers = [
        threading.Thread(target=poll_until, args=(reader, stop), daemon=True)
        for reader in readers[1:]
    ]
    for poller in pollers:
        poller.start()
    try:
        time.sleep(2)  # connected, positions resolved
        before = cpu_seconds(broker)
        time.sleep(4)
        idle_cpu = (cpu_seconds(broker) - before) / 4 * 100
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        latencies = []
        for _ in range(records):
            began = time.monotonic()
            producer.produce(topic, key=b"k", value=b"x" * 200, partition=0)
            producer.flush(5)
            deadline = began + 10
            while time.monotonic() < deadline:
                message = readers[0].poll(1.0)
                if message is not None and message.error() is None:
                    latencies.append((time.monotonic() - began) * 1000)
                    break
            time.sleep(0.013)  # a random phase against the broker's fetch cycle
    finally:
        stop.set()
        for poller in pollers:
            poller.join(timeout=5)
        for reader in readers:
            reader.close()
    return {
        "fetch_wait_ms": wait_ms,
        "idle_consumers": consumers,
        "broker_cpu_percent_idle_polling": round(idle_cpu, 1),
        "produce_to_consume_ms": distribution(latencies, 1),
        "lost": records - len(latencies),
    }


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--waits", default="5,10,50,100,500", help="comma-separated fetch.wait.max.ms values"
    )
    parser.add_argument("--consumers", type=int, default=5)
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    waits = numbers(parser, "--waits", args.waits)
    if args.consumers < 1 or args.records < 1 or any(w < 1 for w in waits):
        parser.error("--consumers, --records and every wait must be at least 1")
    with embedded_broker() as broker:
        settings = fresh_settings(broker)
        topic = settings.topic("worker", "metrics")
        process = psutil.Process(broker.pid)
        points = [
            measure(
                broker.bootstrap_servers,
                topic,
                topic_spec("worker", "metrics").partitions,
                process,
                wait,
                args.consumers,
                args.records,
            )
            for wait in waits
        ]
    emit({"points": points}, args.json)
    if any(point["lost"] for point in points):
        raise SystemExit("broker fetch bench FAILED: a record was not read back within 10 s")


if __name__ == "__main__":
    main()
