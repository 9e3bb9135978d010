"""Writing a job's snapshots off the sharder's loop.

Building and encoding a snapshot costs time in proportion to the job's shards
and the samples recorded in them (most of a second for a 20,000-shard epoch
half done), which would hold up every grant behind it. So the loop only
captures the state (:meth:`JobState.capture`, a copy of the slots, tens of
milliseconds) and hands it over; one thread builds, encodes and produces it,
on a producer of its own (the loop's flushes must not wait for a snapshot of
megabytes).

A capture still waiting when a newer one of the same job arrives is replaced:
only the latest matters. After a bus reset the waiting ones are dropped, as
their log offsets point into the log that is gone (the sharder re-publishes
its state itself).
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

from confluent_kafka import KafkaException, Producer

from antdt.schemas.codec import Codec
from antdt.services.sharder import metrics
from antdt.services.sharder.state import Captured

log = logging.getLogger(__name__)


class SnapshotWriter:
    """One background thread that writes the snapshots it is handed; :meth:`write_now` writes in the caller's."""

    def __init__(self, producer: Producer, topic: str, codec: Codec):
        self._producer, self._topic, self._codec = producer, topic, codec
        self._pending: dict[str, tuple[Captured, int | None, int]] = {}  # job -> (capture, log offset, generation)
        self._lock = threading.Condition()
        self._generation = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="sharder-snapshots", daemon=True)
        self._thread.start()

    def submit(self, captured: Captured, log_offset: int | None) -> None:
        """Write this capture soon, unless a newer one of the job comes first."""
        with self._lock:
            self._pending[captured.job_id] = (captured, log_offset, self._generation)
            self._lock.notify()

    def discard_pending(self) -> None:
        """Forget what is waiting, and what is being built now: the bus it belongs to is gone."""
        with self._lock:
            self._generation += 1
            self._pending.clear()

    def write_now(self, captured: Captured, log_offset: int | None) -> bool:
        """Build, encode and produce in the caller's thread; False if the producer refused it."""
        with self._lock:
            generation = self._generation
        return self._write(captured, log_offset, generation)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is waiting, then stop the thread (bounded: a snapshot left unwritten only lengthens recovery)."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("snapshots still being written after %.0f s: left unwritten", timeout_s)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._lock.wait()
                if not self._pending:
                    return
                _, (captured, log_offset, generation) = self._pending.popitem()
            self._write(captured, log_offset, generation)

    def _write(self, captured: Captured, log_offset: int | None, generation: int) -> bool:
        try:
            snapshot = captured.to_snapshot(datetime.now(timezone.utc), log_offset=log_offset)
            value = self._codec.encode(snapshot, self._topic)
            with self._lock:
                if generation != self._generation:
                    return False  # the bus was reset while it was built
                self._producer.produce(self._topic, key=captured.job_id.encode(), value=value)
        except (KafkaException, BufferError) as exc:  # the log stays the source of truth; recovery just replays more
            log.error("snapshot of job %s not written: %s", captured.job_id, exc)
            metrics.SNAPSHOT_FAILURES.inc()
            return False
        metrics.SNAPSHOTS.inc()
        return True
