"""Non-blocking event emission for the agent.

Training must never wait on the bus. :meth:`EventEmitter.emit` only appends
to a bounded in-memory queue; a background thread encodes (off the training
thread) and hands records to the Kafka producer. When the bus is unreachable
the producer's own queue fills, then ours: the oldest events are dropped and
counted (:attr:`dropped`), the newest kept, so when the bus comes back the
monitor sees the current picture first. When the bus last acknowledged an
event (:attr:`last_delivered`) tells from the worker's side that it stopped
reporting (:mod:`antdt.worker.agent_metrics`).

A bus reset (a broker restarted empty, the embedded broker's roll) takes the
topics away for a moment: the producer is kept fresh by the process's bus
watch, and an event it refuses for a topic that is not back yet waits in the
queue like one it has no room for, instead of being dropped as unencodable;
one the producer took whose delivery then fails for the missing topic (its
metadata still named the topic, the restarted broker did not) goes back to
the front of the queue, as it was encoded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from confluent_kafka import KafkaError

from antdt.bus.clients import make_producer
from antdt.bus.watch import MISSING_TOPIC, produce_or_refused, shared_watch
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import AvroModel
from antdt.settings import Settings

log = logging.getLogger(__name__)


class EventEmitter:
    """Bounded, drop-oldest queue drained by a background producer thread."""

    def __init__(
        self, settings: Settings, client_id: str, capacity: int = 1000, codec: Codec | None = None
    ):
        # (topic, key, event): an event is encoded when handed to the producer, or is the bytes
        # it was encoded to when a reset failed its delivery
        self._queue: deque[tuple[str, bytes, AvroModel | bytes]] = deque()
        self._failed_for_reset: list[tuple[str, bytes, bytes]] = []  # filled by delivery reports
        self.capacity = capacity
        self.dropped = 0
        self.delivered = 0
        self.failed = 0
        #: time.monotonic() of the last acknowledged delivery (of the emitter's making, before one)
        self.last_delivered = time.monotonic()
        self._codec = codec or make_codec(settings.schema_registry_url)
        self._client_id = client_id
        self._producer = None  # made by start(): a client connects (and logs in) once it exists
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="antdt-emitter", daemon=True)
        self._settings = settings
        self._watch = None
        #: events refused, or failed on delivery, because a bus reset had taken their topic; each
        #: tried again
        self.refused = 0

    def start(self) -> EventEmitter:
        self._producer = make_producer(
            self._settings,
            client_id=self._client_id,
            **{
                "queue.buffering.max.messages": self.capacity,
                "linger.ms": 5,
            },
        )
        self._thread.start()
        return self

    def _watch_once_delivered(self) -> None:
        """After a reset, what is queued goes out to the re-created topics at once: the process's
        bus watch keeps the producer fresh. It is taken once the bus has acknowledged an event, so
        a worker refused at login does not add a client retrying it."""
        if self._watch is None and self.delivered:
            self._watch = shared_watch(self._settings)
            self._watch.keep_fresh(self._producer)

    def emit(self, topic: str, key: str, message: AvroModel) -> None:
        """Queue an event; never blocks. Over capacity, the oldest queued event is dropped."""
        if len(self._queue) >= self.capacity:
            try:
                self._queue.popleft()
                self.dropped += 1
            except IndexError:
                pass
        self._queue.append((topic, key.encode(), message))
        self._wake.set()

    @property
    def unsent(self) -> int:
        """Events queued here or in the producer, not yet acknowledged by the bus."""
        return len(self._queue) + (self._producer.in_flight if self._producer is not None else 0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.1)
            self._wake.clear()
            self._drain()
            self._producer.poll(0)
            self._watch_once_delivered()
        self._drain()

    def _drain(self) -> None:
        while self._failed_for_reset:  # ahead of everything queued since, in their order
            self._queue.appendleft(self._failed_for_reset.pop())
        while self._queue:
            topic, key, message = self._queue[0]
            try:
                value = (
                    message if isinstance(message, bytes) else self._codec.encode(message, topic)
                )
                refused = produce_or_refused(
                    self._producer, topic, key=key, value=value, on_delivery=self._delivered
                )
            except BufferError:  # the producer's queue is full: the bus is slow or away
                self._producer.poll(0.05)
                return
            except Exception as exc:  # an unencodable event is a bug; never let it stop training
                self._cannot_produce(exc)
            else:
                if refused is not None:
                    self._topic_not_back(topic, refused)
                    return
            self._queue.popleft()

    def _cannot_produce(self, exc: Exception) -> None:
        log.error("dropping an event that cannot be produced: %s", exc)
        self.failed += 1

    def _topic_not_back(self, topic: str, refused: KafkaError) -> None:
        """A reset took ``topic`` and the producer saw it gone: the event stays first in the queue
        and is tried again at the next wake-up, once the watch has made the topic again."""
        self._count_refused(topic, refused)
        self._producer.poll(0.05)

    def _count_refused(self, topic: str, error: KafkaError) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 100 == 0:
            log.warning(
                "%s not back after a bus reset (%s): events wait in the queue (%d refused so far)",
                topic,
                error.str(),
                self.refused,
            )

    def _delivered(self, error: KafkaError | None, record) -> None:
        if error is None:
            self.delivered += 1
            self.last_delivered = time.monotonic()
        elif error.code() in MISSING_TOPIC:  # sent again at the next drain, as it was encoded
            self._count_refused(record.topic(), error)
            self._failed_for_reset.append((record.topic(), record.key(), record.value()))
        else:
            self.dropped += 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and give queued events ``timeout_s`` to be delivered."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(max(timeout_s, 1.0))  # it stops within one wake-up
        if self._watch is not None:
            self._watch.forget(self._producer)
            self._watch.release()
            self._watch = None
        if self._queue:  # refused for a topic that never came back, or no room to the end
            self.dropped += len(self._queue)
            log.warning("agent shutdown: %d queued event(s) never handed over", len(self._queue))
            self._queue.clear()
        if self._producer is None:  # never started
            return
        remaining = self._producer.undelivered_after_flush(timeout_s) + len(self._failed_for_reset)
        self._failed_for_reset.clear()
        if remaining:
            self.dropped += remaining
            log.warning("agent shutdown: %d event(s) not delivered", remaining)
            # else the producer lives on, retrying them, until the process exits
            self._producer.purge()
            self._producer.poll(0)
