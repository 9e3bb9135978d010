"""Runs a :class:`~antdt.loadgen.fleet.Fleet` on the bus: a few producers, one reader thread.

Real agents each have a producer of their own; one producer for a thousand
simulated workers would queue their records behind each other (the embedded
profile allows one request in flight), so every ``workers_per_producer``
workers share one, and a worker's records keep their order. The main loop
sends what the fleet says is due (every ``tick_s``); the reader
takes the sharder's assignments and the controller's commands from every
partition of their topics (from the beginning: a scale run starts on fresh
topics) and hands them to the fleet, which answers commands with acks. A
request's grant is timed from the moment it was handed to the producer to
the moment its answer was read, both on this process's clock.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from antdt.bus.clients import flush_or_raise, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.markers import marker_id
from antdt.bus.readers import assign_now, poll_batch
from antdt.bus.watch import Rewinder, shared_watch
from antdt.loadgen.fleet import Fleet, FleetSpec, Observations, Outgoing
from antdt.schemas.codec import make_codec
from antdt.schemas.models import MitigationCommand, ProgressKind, ShardAssignment, ShardProgress
from antdt.settings import Settings
from antdt.topics import topic_spec

log = logging.getLogger(__name__)


class FleetDriver:
    """A fleet's traffic for ``seconds``; :meth:`run` returns what it observed."""

    def __init__(
        self,
        settings: Settings,
        spec: FleetSpec,
        tick_s: float = 0.005,
        workers_per_producer: int = 250,
    ):
        self.settings, self.spec, self.tick_s = settings, spec, tick_s
        self.codec = make_codec(settings.schema_registry_url)
        self.sent = 0
        self.dropped = 0  # records produce() refused (their topic gone with a bus reset)
        self.acked_s: list[float] = []  # produce to broker acknowledgement, of each shard request
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producers = [
            make_producer(
                settings, client_id=f"{settings.client_id}-loadgen-{i}", **{"linger.ms": 1}
            )
            for i in range(max(1, -(-spec.workers // workers_per_producer)))
        ]
        self._producer_of: dict[str, object] = {}
        self.fleet = Fleet(spec, time.monotonic(), datetime.now(UTC))

    def run(self, seconds: float) -> Observations:
        reader = threading.Thread(target=self._read, name="loadgen-reader", daemon=True)
        reader.start()
        try:
            self._send(self.fleet.joined(time.monotonic()))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                with self._lock:
                    due = self.fleet.due(time.monotonic())
                self._send(due)
                for producer in self._producers:
                    producer.poll(0)
                time.sleep(self.tick_s)
        finally:
            self._stop.set()
            reader.join(timeout=10)
            for producer in self._producers:
                flush_or_raise(producer, 30)
        return self.fleet.seen

    def _send(self, records: list[Outgoing]) -> None:
        for record in records:
            topic = self.settings.topic(record.component, record.name)
            value = record.value
            request = isinstance(value, ShardProgress) and value.kind is ProgressKind.REQUESTED
            sent = time.monotonic()
            self._produce(
                self._producer_for(record.worker),
                topic,
                record.key,
                self.codec.encode(value, topic),
                self._timed(sent) if request else None,
            )
            if request:
                with self._lock:
                    self.fleet.asked_at(record.worker, value.seq, sent)

    def _timed(self, sent: float):
        def acked(error, _message) -> None:
            if error is None:
                self.acked_s.append(time.monotonic() - sent)

        return acked

    def _producer_for(self, worker: str):
        producer = self._producer_of.get(worker)
        if producer is None:
            producer = self._producers[len(self._producer_of) % len(self._producers)]
            self._producer_of[worker] = producer
        return producer

    def _produce(self, producer, topic: str, key: str, value: bytes, on_delivery=None) -> None:
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery)
                with self._lock:  # acks are sent from the reader thread
                    self.sent += 1
                return
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)
            except KafkaException as exc:  # a topic a bus reset took: the agent drops it too
                log.debug("loadgen: a record for %s dropped: %s", topic, exc)
                with self._lock:
                    self.dropped += 1
                return

    def _read(self) -> None:
        """Grants and commands, read from the beginning again after a bus reset (as the agent's
        readers do: a reader left at its old offsets would wait past the new topics' records)."""
        consumer = make_consumer(self.settings, pace=FetchPace.LOW_LATENCY)
        watch = shared_watch(self.settings)
        for producer in self._producers:  # what they send after a reset goes out at once
            watch.keep_fresh(producer)
        try:
            assign_now(
                consumer,
                [
                    TopicPartition(self.settings.topic(component, name), p, OFFSET_BEGINNING)
                    for component, name in (("shard", "assignments"), ("controller", "commands"))
                    for p in range(topic_spec(component, name).partitions)
                ],
            )
            rewinder = Rewinder(consumer, watch)
            while not self._stop.is_set():
                rewinder.check()
                for message in poll_batch(consumer, 5000, 0.05):
                    self._take(message)
        finally:
            consumer.close()
            for producer in self._producers:
                watch.forget(producer)
            watch.release()

    def _take(self, message) -> None:
        if message.error() is not None or marker_id(message) is not None or not message.value():
            return
        try:
            value = self.codec.decode(message.value())
        except Exception:  # not ours to judge: the services dead-letter what they cannot read
            log.debug("loadgen: an undecodable record on %s", message.topic(), exc_info=True)
            return
        now = time.monotonic()
        with self._lock:
            if isinstance(value, ShardAssignment):
                self.fleet.on_assignment(value, now)
                return
            ack = (
                self.fleet.on_command(value, now) if isinstance(value, MitigationCommand) else None
            )
        if ack is not None:
            self._send([ack])
