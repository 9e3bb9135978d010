"""The worker's side of the sharding protocol: ask for shards, report on them.

Requests go to ``shard.progress`` (keyed by job); answers come back on the
worker's own partition of ``shard.assignments`` (keyed ``<job>/<worker>``),
read by manual assignment with no consumer group. Before the first request
the reader proves it is positioned by reading back a marker it wrote, so no
answer can slip past it. Answers are matched to requests by ``in_reply_to``.
"""

from __future__ import annotations

import itertools
import time
import uuid


from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.markers import marker_id
from antdt.bus.readers import follow_key, poll_batch
from antdt.errors import AntdtError
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import DatasetSpec, ProgressKind, ShardAssignment, ShardProgress
from antdt.schemas.types import utc_now
from antdt.settings import Settings
from antdt.topics import topic_spec, worker_key


class NoAnswer(AntdtError):
    """The sharder did not answer in time."""


class ShardClient:
    """Request/reply with the sharder for one worker incarnation."""

    def __init__(self, settings: Settings, job_id: str, worker_id: str, dataset: DatasetSpec | None = None, codec: Codec | None = None):
        self.job_id, self.worker_id, self.dataset = job_id, worker_id, dataset
        self.incarnation = uuid.uuid4().hex
        self.codec = codec or make_codec(settings.schema_registry_url)
        self._seq = itertools.count(1)
        self._progress_topic = topic_spec("shard", "progress").full_name(settings.topic_prefix)
        self._assignments_topic = topic_spec("shard", "assignments").full_name(settings.topic_prefix)
        self._key = worker_key(job_id, worker_id).encode()
        self._producer = make_producer(settings, client_id=f"antdt-worker-{worker_id}", **{"linger.ms": 0})
        self._consumer = make_consumer(settings, client_id=f"antdt-worker-{worker_id}", low_latency=True)
        self._highest_writer_epoch = 0
        self._position_reader(settings)

    def _position_reader(self, settings: Settings) -> None:
        """Read our partition up to a fresh marker: no answer can slip past the reader after this."""
        for _ in follow_key(settings, self._consumer, self._producer, self._assignments_topic, self._key, timeout_s=30.0):
            pass

    # ------------------------------------------------------------ sending

    def send(self, kind: ProgressKind, epoch: int, **fields) -> int:
        """Send one report; returns its seq (answers cite it in in_reply_to)."""
        seq = next(self._seq)
        report = ShardProgress(
            job_id=self.job_id, worker_id=self.worker_id, incarnation=self.incarnation, seq=seq, kind=kind,
            epoch=epoch, timestamp=utc_now(), **fields,
        )
        self._producer.produce(self._progress_topic, key=self.job_id.encode(), value=self.codec.encode(report, self._progress_topic))
        self._producer.poll(0)
        return seq

    def request(self, epoch: int, quota: int | None = None, timeout_s: float = 10.0) -> ShardAssignment:
        """Ask for shards up to ``quota``; block until the sharder answers."""
        seq = self.send(ProgressKind.REQUESTED, epoch, quota=quota, dataset=self.dataset)
        return self.wait_answer(seq, timeout_s)

    def started(self, epoch: int, shard_id: int, attempt: int, step: int | None = None) -> None:
        self.send(ProgressKind.STARTED, epoch, shard_id=shard_id, attempt=attempt, step=step)

    def done(self, epoch: int, shard_id: int, attempt: int, step: int | None = None) -> None:
        self.send(ProgressKind.DONE, epoch, shard_id=shard_id, attempt=attempt, step=step)

    def failed(self, epoch: int, shard_id: int, attempt: int, error: str) -> None:
        self.send(ProgressKind.FAILED, epoch, shard_id=shard_id, attempt=attempt, error=error)

    def checkpoint(self, epoch: int, step: int | None = None, timeout_s: float = 10.0) -> int:
        """The shard-state version to store with a model checkpoint."""
        return self.wait_answer(self.send(ProgressKind.CHECKPOINT, epoch, step=step), timeout_s).version

    def rewind(self, epoch: int, version: int, timeout_s: float = 30.0) -> ShardAssignment:
        """Restore the job's shard state to ``version`` (after restoring the model checkpoint)."""
        return self.wait_answer(self.send(ProgressKind.REWIND, epoch, version=version), timeout_s)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every report sent so far is on the bus (before a checkpoint version is asked)."""
        self._producer.flush(timeout_s)

    # ------------------------------------------------------------ receiving

    def wait_answer(self, seq: int, timeout_s: float = 10.0) -> ShardAssignment:
        """The answer to request ``seq``; answers from a fenced (older) sharder are ignored."""
        self._producer.flush(timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in poll_batch(self._consumer, 100, min(0.05, max(0.001, deadline - time.monotonic()))):
                if message.key() != self._key or marker_id(message) is not None:
                    continue
                answer = self.codec.decode(message.value())
                if answer.writer_epoch < self._highest_writer_epoch:
                    continue
                self._highest_writer_epoch = answer.writer_epoch
                if answer.in_reply_to == seq:
                    return answer
        raise NoAnswer(f"no answer from the sharder to {self.worker_id}'s request {seq} within {timeout_s:.0f} s")

    def close(self) -> None:
        self._producer.flush(5)
        self._consumer.close()

    def __enter__(self) -> ShardClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
