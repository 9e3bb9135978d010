"""Writing a job's snapshots off the sharder's loop.

Building and encoding a snapshot costs time in proportion to the job's shards
and the samples recorded in them (most of a second for a 20,000-shard epoch
half done), which would hold up every grant behind it. So the loop only
captures the state (:meth:`JobState.capture`: a list copy, plus the slots
changed since the last capture) and hands it over; one thread produces it,
on a producer of its own (the loop's flushes must not wait for a snapshot of
megabytes). The thread has it built and encoded in a process of its own
(``builder="process"``, the service's choice): built in a thread, it would
hold the interpreter lock for tenths of a second at a time and stall the loop
all the same. If that process fails, the thread builds the snapshot itself.

A capture still waiting when a newer one of the same job arrives is replaced:
only the latest matters. After a bus reset the waiting ones are dropped, as
their log offsets point into the log that is gone (the sharder re-publishes
its state itself).
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Literal

from confluent_kafka import KafkaException, Producer

from antdt.schemas.codec import Codec, make_codec
from antdt.services.sharder import metrics
from antdt.services.sharder.state import Captured

log = logging.getLogger(__name__)

#: How long the thread waits for the builder process before it builds the snapshot itself.
BUILD_TIMEOUT_S = 60.0
#: Framing on the builder's pipes: a status byte (requests: 0) and the length of what follows.
_FRAME = struct.Struct("!BI")
_OK, _FAILED = 0, 1


def build_snapshot(
    captured: Captured, log_offset: int | None, registry_url: str | None, topic: str
) -> bytes:
    """The encoded snapshot of ``captured``."""
    snapshot = captured.to_snapshot(datetime.now(UTC), log_offset=log_offset)
    return _codec(registry_url).encode(snapshot, topic)


@functools.cache
def _codec(registry_url: str | None) -> Codec:
    return make_codec(registry_url)


class BuilderFailed(Exception):
    """The builder process did not return a snapshot (it failed, died or took too long)."""


class BuilderProcess:
    """A child process that builds and encodes snapshots, one at a time, over its stdin and stdout.

    It exits when its stdin closes, so it never outlives the sharder, even
    one killed with SIGKILL.
    """

    def __init__(self):
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        # a request of megabytes is written as the pipe takes it, within the build's deadline
        os.set_blocking(self._process.stdin.fileno(), False)

    def build(
        self,
        captured: Captured,
        log_offset: int | None,
        registry_url: str | None,
        topic: str,
        timeout_s: float = BUILD_TIMEOUT_S,
    ) -> bytes:
        payload = pickle.dumps(
            (captured, log_offset, registry_url, topic), protocol=pickle.HIGHEST_PROTOCOL
        )
        deadline = time.monotonic() + timeout_s
        self._send(_FRAME.pack(_OK, len(payload)) + payload, deadline)
        status, length = _FRAME.unpack(self._read(_FRAME.size, deadline))
        body = self._read(length, deadline)
        if status != _OK:
            raise BuilderFailed(body.decode(errors="replace"))
        return body

    def _send(self, request: bytes, deadline: float) -> None:
        """Write ``request`` as the builder reads it, before ``deadline``: a builder wedged on an
        earlier request must not hold the sharder's snapshot thread for good."""
        view, fd = memoryview(request), self._process.stdin.fileno()
        while view:
            _, ready, _ = select.select([], [fd], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise BuilderFailed("the builder process did not take its request in time")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue  # less room than a small remainder needs at once: select again
            except OSError as exc:
                raise BuilderFailed(f"the builder process is gone ({exc})") from exc

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, fd = [], self._process.stdout.fileno()
        while size:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise BuilderFailed("the builder process took too long")
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                raise BuilderFailed(f"the builder process exited ({self._process.poll()})")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()


def serve_builds(requests, answers) -> None:
    """The builder process: build what comes on ``requests`` until it closes."""
    while header := requests.read(_FRAME.size):
        _, length = _FRAME.unpack(header)
        try:
            value, status = build_snapshot(*pickle.loads(requests.read(length))), _OK
        except Exception as exc:  # said to the sharder, which builds the snapshot itself
            value, status = f"{type(exc).__name__}: {exc}".encode(), _FAILED
        answers.write(_FRAME.pack(status, len(value)) + value)
        answers.flush()


class SnapshotWriter:
    """One background thread that writes the snapshots it is handed; :meth:`write_now` writes in the
    caller's.

    ``builder``: where the thread has a snapshot built, ``"thread"`` (itself)
    or ``"process"`` (a process started at the first snapshot, with
    ``registry_url`` for its codec).
    """

    def __init__(
        self,
        producer: Producer,
        topic: str,
        codec: Codec,
        builder: Literal["thread", "process"] = "thread",
        registry_url: str | None = None,
    ):
        self._producer, self._topic, self._codec = producer, topic, codec
        self._builder, self._registry_url = builder, registry_url
        self._process: BuilderProcess | None = None
        self._building = threading.Lock()  # the builder process builds one snapshot at a time
        # job -> (capture, log offset, generation)
        self._pending: dict[str, tuple[Captured, int | None, int]] = {}
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
        """Build (in the builder process, if there is one), encode and produce before returning;
        False if the producer refused it. Built in the service, a job's whole snapshot (after a
        bus reset: every job at once) is a burst of millions of objects that leaves the heap
        fragmented and the service's RSS higher at every reset."""
        with self._lock:
            generation = self._generation
        return self._write(captured, log_offset, generation, elsewhere=self._builder == "process")

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is waiting, then stop the thread (bounded: a snapshot left unwritten only
        lengthens recovery)."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("snapshots still being written after %.0f s: left unwritten", timeout_s)
        if self._process is not None:
            self._process.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._lock.wait()
                if not self._pending:
                    return
                _, (captured, log_offset, generation) = self._pending.popitem()
            self._write(captured, log_offset, generation, elsewhere=self._builder == "process")

    def _write(
        self, captured: Captured, log_offset: int | None, generation: int, elsewhere: bool = False
    ) -> bool:
        try:
            value = self._built_elsewhere(captured, log_offset) if elsewhere else None
            if value is None:
                snapshot = captured.to_snapshot(datetime.now(UTC), log_offset=log_offset)
                value = self._codec.encode(snapshot, self._topic)
            with self._lock:
                if generation != self._generation:
                    return False  # the bus was reset while it was built
                self._producer.produce(self._topic, key=captured.job_id.encode(), value=value)
        # the log stays the source of truth; recovery just replays more
        except (KafkaException, BufferError) as exc:
            log.error("snapshot of job %s not written: %s", captured.job_id, exc)
            metrics.SNAPSHOT_FAILURES.inc()
            return False
        metrics.SNAPSHOTS.inc()
        return True

    def _built_elsewhere(self, captured: Captured, log_offset: int | None) -> bytes | None:
        """The snapshot built by the builder process; None (and the process replaced next time) if
        it failed."""
        with self._building:
            try:
                if self._process is None:
                    self._process = BuilderProcess()
                return self._process.build(captured, log_offset, self._registry_url, self._topic)
            except (BuilderFailed, OSError) as exc:
                log.warning("snapshot builder process failed (%s): building in the service", exc)
                metrics.SNAPSHOT_BUILDER_FAILURES.inc()
                process, self._process = self._process, None
                if process is not None:
                    process.close()
                return None


if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else writes to stdout goes to stderr, not into the answers
    serve_builds(sys.stdin.buffer, answers)
