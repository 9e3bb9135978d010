"""How soon a producer and a reader use the topics a bus reset re-created.

The embedded broker is restarted (empty, as a roll or a crash leaves it) and
the bus watch re-creates the topics; then a producer sends a record every 50
ms and a reader that was rewound at the reset reads them. Per restart it
reports how long after the new broker first answered the bus watch saw the
reset (``reset_noticed_ms``) and, for the first record sent once the topics are
back, the time to its acknowledgement and to its read. ``--plain`` runs librdkafka left alone (no
metadata refresh after the reset): a producer then held its records 1.4-1.9 s
and a rewound reader fetched 0.4-0.9 s late. A rewind starts the new topics at
offset 0: rewound to their beginning, a reader's first rewind waited 500 ms for
librdkafka to look that up (docs/reliability.md, "What a roll costs").

    .venv/bin/python bench/reset_pickup_bench.py [--restarts 5] [--plain] [--json]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from benchlib import embedded_broker, emit, fresh_settings, spread
from confluent_kafka import TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.readers import BEGINNING, assign_now, poll_batch
from antdt.bus.watch import BusWatch, Rewinder

#: Records sent after each restart, one every SEND_EVERY_S.
RECORDS, SEND_EVERY_S = 10, 0.05
#: How long a record may take to be read before the run counts as failed.
READ_WITHIN_S = 15.0


class PlainRewinder(Rewinder):
    """The reader as librdkafka leaves it: rewound, its metadata not refreshed."""

    def _refresh_if_back(self) -> None:
        return None


class Reader:
    """Reads one partition on its own thread, noting when each value arrived."""

    def __init__(self, settings, topic: str, watch: BusWatch, plain: bool):
        self.consumer = make_consumer(settings, pace=FetchPace.LOW_LATENCY)
        assign_now(self.consumer, [TopicPartition(topic, 0, BEGINNING)])
        self.rewinder = (PlainRewinder if plain else Rewinder)(self.consumer, watch)
        self.read_at: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.rewinder.check()
            for message in poll_batch(self.consumer, 500, 0.02):
                if message.error() is None and message.value():
                    self.read_at.setdefault(message.value(), time.monotonic())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.consumer.close()


def one_restart(broker, watch: BusWatch, producer, reader: Reader, topic: str, n: int) -> dict:
    broker.restart()
    answering = time.monotonic()  # the new broker answers metadata from here
    deadline = answering + READ_WITHIN_S
    noticed = None
    while watch.restored < n:
        if noticed is None and watch.generation >= n:
            noticed = time.monotonic()
        if time.monotonic() > deadline:
            sys.exit(f"reset pickup bench FAILED: the topics were not back in {READ_WITHIN_S} s")
        time.sleep(0.001)
    noticed = noticed or time.monotonic()
    sent, acked = {}, {}

    def on_delivery(error, message) -> None:
        if error is None:
            acked.setdefault(message.value(), time.monotonic())

    for i in range(RECORDS):
        value = b"restart %d record %d" % (n, i)
        sent[value] = time.monotonic()
        producer.produce(
            topic,
            value=value,
            partition=0,
            on_delivery=on_delivery,
        )
        next_send = time.monotonic() + SEND_EVERY_S
        while time.monotonic() < next_send:
            producer.poll(0.005)  # serves the delivery reports as they come
    producer.flush(READ_WITHIN_S)
    while not all(value in reader.read_at for value in sent):
        if time.monotonic() > deadline:
            sys.exit("reset pickup bench FAILED: records sent after the reset were not read")
        time.sleep(0.01)
    first = next(iter(sent))
    return {
        "noticed_ms": round((noticed - answering) * 1000, 1),
        "acked_ms": round((acked[first] - sent[first]) * 1000, 1),
        "read_ms": round((reader.read_at[first] - sent[first]) * 1000, 1),
    }


def measure(restarts: int, plain: bool) -> dict:
    with embedded_broker() as broker:
        settings = fresh_settings(broker)
        topic = settings.topic("control", "config")
        watch = BusWatch(settings).start()
        producer = make_producer(settings)
        if not plain:
            watch.keep_fresh(producer)
        reader = Reader(settings, topic, watch, plain)
        try:
            while watch.cluster_id is None:
                time.sleep(0.01)
            runs = [
                one_restart(broker, watch, producer, reader, topic, n + 1) for n in range(restarts)
            ]
        finally:
            reader.close()
            watch.close()
    return {
        "restarts": restarts,
        "refresh": not plain,
        "reset_noticed_ms": spread([run["noticed_ms"] for run in runs], 1),
        "first_record_acked_ms": spread([run["acked_ms"] for run in runs], 1),
        "first_record_read_ms": spread([run["read_ms"] for run in runs], 1),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--plain", action="store_true", help="no metadata refresh after a reset")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.restarts < 1:
        parser.error("--restarts must be at least 1")
    emit(measure(args.restarts, args.plain), args.json)


if __name__ == "__main__":
    main()
