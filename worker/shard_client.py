"""The worker's side of the sharding protocol: ask for shards, report on them.

Requests go to ``shard.progress`` (keyed by job); answers come back on the
worker's own partition of ``shard.assignments`` (keyed ``<job>/<worker>``),
read by manual assignment with no consumer group. Before the first request
the reader proves it is positioned by reading back a marker it wrote, so no
answer can slip past it. Answers are matched to requests by ``in_reply_to``;
several threads may wait at once (a data feed asking for shards while the
training thread commits), one of them polling for all.
A record on the worker's key that is not an assignment for this worker goes
to the dead-letter topic and is counted; the wait for the answer goes on.
After a bus reset (:mod:`antdt.bus.watch`) the reader starts over at offset
0 and the last seconds of reports are sent again; a commit an answer shows
lost is sent again too (:mod:`antdt.worker.sent_commits`). A client that
closes first waits, bounded, until the sharder has read its last report, so a
reset just after its last DONE cannot take that report with nobody left to
send it again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import deque

from confluent_kafka import KafkaException, TopicPartition

from antdt.bus.clients import make_consumer
from antdt.bus.config import DELIVERY_BOUND_S, FetchPace
from antdt.bus.markers import marker_id, send_marker
from antdt.bus.own_key import OwnKeyClient
from antdt.bus.readers import decode_addressed, poll_batch
from antdt.bus.watch import produce_through_reset, refresh_metadata
from antdt.errors import AntdtError, BusError
from antdt.schemas.codec import Codec
from antdt.schemas.models import (
    DatasetSpec,
    GrantRef,
    ProgressKind,
    ShardAssignment,
    ShardProgress,
)
from antdt.schemas.types import utc_now
from antdt.settings import Settings
from antdt.topics import topic_spec
from antdt.worker.sent_commits import SentCommits

#: When an answer is this late, write a marker to our partition (see ShardClient._nudge), then again
#: every second.
NUDGE_AFTER_S = 0.25
NUDGE_EVERY_S = 1.0
#: How long a closing client waits for the sharder to read its last report (a reset within that
#: time has the report sent again); past it the client closes anyway, with a warning.
CLOSE_WAIT_S = 5.0
#: Between looks at the sharder's committed offset while closing.
CLOSE_LOOK_EVERY_S = 0.05
#: After a bus reset, the reports of this many last seconds are sent again (at most RESEND_MAX of
#: them).
RESEND_WINDOW_S = 15.0
RESEND_MAX = 512

log = logging.getLogger(__name__)


class NoAnswer(AntdtError):
    """The sharder did not answer in time."""


class RequestRefused(AntdtError):
    """The sharder refused a worker's request for shards (its dataset disagrees with the job's,
    say): asking again cannot help."""


class ShardClient(OwnKeyClient):
    """Request/reply with the sharder for one worker incarnation."""

    def __init__(
        self,
        settings: Settings,
        job_id: str,
        worker_id: str,
        dataset: DatasetSpec | None = None,
        codec: Codec | None = None,
        incarnation: str | None = None,
    ):
        """``incarnation``: the process's (the agent's, so that its reports and its lifecycle events
        agree)."""
        self._progress_topic = topic_spec("shard", "progress").full_name(settings.topic_prefix)
        self._assignments_topic = topic_spec("shard", "assignments").full_name(
            settings.topic_prefix
        )
        super().__init__(
            settings,
            job_id,
            worker_id,
            self._assignments_topic,
            f"antdt-worker-{worker_id}",
            codec,
            pace=FetchPace.STEADY,  # grants are asked for a shard ahead: no need to poll hard
            replies_collected_late=True,  # ... and read when the shard before is done
        )
        self.dataset = dataset
        self.incarnation = incarnation or uuid.uuid4().hex
        self._seq = itertools.count(1)
        self._highest_writer_epoch = 0
        self._recent: deque[tuple[float, bytes]] = deque(maxlen=RESEND_MAX)
        self._sent_commits = SentCommits(worker_id)
        self._last_seq = 0
        #: Commit reports sent again because an answer showed them lost.
        self.recommitted = 0
        self._send_lock = threading.Lock()  # seq order is send order
        self._poll_lock = threading.Lock()  # one thread polls the reader at a time
        self._reset_lock = threading.Lock()
        self._arrived = threading.Condition()
        self._wanted: set[int] = set()  # seqs whose answer someone will collect
        self._answers: dict[int, ShardAssignment] = {}
        self._nudge_at = 0.0
        self._failed: list[str] = []  # delivery errors since the last flush
        self._failed_lock = threading.Lock()  # the delivery callback runs in whichever thread polls
        self._settings = settings
        #: the partition and offset of the report the bus acknowledged last (in send order)
        self._last_delivered: TopicPartition | None = None
        #: the last report the sharder is known to have read past, as (topic, partition, offset)
        self._read_through: tuple[str, int, int] | None = None

    # ------------------------------------------------------------ sending

    def send(self, kind: ProgressKind, epoch: int, answered: bool = True, **fields) -> int:
        """Send one report; returns its seq (answers cite it in in_reply_to).

        ``answered``: an answer will be collected with :meth:`wait_answer`
        (the reader keeps only answers someone asked for).
        """
        self._after_bus_reset()
        with self._send_lock:
            seq = self._last_seq = next(self._seq)
            report = ShardProgress(
                job_id=self.job_id,
                worker_id=self.worker_id,
                incarnation=self.incarnation,
                seq=seq,
                kind=kind,
                epoch=epoch,
                timestamp=utc_now(),
                **fields,
            )
            value = self.codec.encode(report, self._progress_topic)
            if answered:
                with self._arrived:
                    self._wanted.add(seq)
                    self._await_replies(True)
            self._produce(value)
            if kind is ProgressKind.COMMIT:
                self._sent_commits.add(seq, value, epoch, fields["commits"])
        self._producer.poll(0)
        return seq

    def _produce(self, value: bytes, remember: bool = True) -> None:
        """One report onto the progress topic; ``remember``: kept to be sent again after a bus
        reset."""
        produce_through_reset(
            self._producer,
            self._watch,
            self._progress_topic,
            key=self.job_id.encode(),
            value=value,
            on_delivery=self._delivered,
        )
        if remember:
            self._recent.append((time.monotonic(), value))

    def resend_lost_commits(self, answer: ShardAssignment) -> int:
        """Send again the commits ``answer`` shows the sharder never got; returns how many."""
        with self._send_lock:
            again = self._sent_commits.lost(answer, self._last_seq)
            for value in again:
                self._produce(value)
        if again:
            self.recommitted += len(again)
            self._producer.poll(0)
            log.warning(
                "worker %s: %d commit(s) missing from the sharder's answer to %d: sent again",
                self.worker_id,
                len(again),
                answer.in_reply_to,
            )
        return len(again)

    def _after_bus_reset(self) -> None:
        """If the bus came back empty: answers from offset 0, and the recent reports sent again.

        A report the old broker took but the sharder had not read yet, or an
        answer we had not read yet, is gone; without this a request would
        wait out its timeout. Every report is idempotent at the sharder
        (reports name their grant; a repeated request answers what we hold).
        """
        with self._reset_lock:
            if not self._rewinder.check():
                return
        refresh_metadata(self._producer)
        since = time.monotonic() - RESEND_WINDOW_S
        again = [value for at, value in self._recent if at >= since]
        for value in again:
            self._produce(value, remember=False)
        self._producer.poll(0)
        log.warning(
            "the bus was reset: %d report(s) of the last %.0f s sent again",
            len(again),
            RESEND_WINDOW_S,
        )

    def ask(self, epoch: int, quota: int | None = None, read_shards: list[int] = ()) -> int:
        """Ask for shards up to ``quota`` without waiting; :meth:`wait_answer` with the seq returned
        collects the answer.

        ``read_shards``: held shards read to the end (their commits will follow), not counted
        against the quota.
        """
        return self.send(
            ProgressKind.REQUESTED,
            epoch,
            quota=quota,
            dataset=self.dataset,
            read_shards=list(read_shards),
        )

    def give_back(self, epoch: int, grants: list[tuple[int, int]]) -> None:
        """Give back held grants, ``(shard, attempt)``, of which nothing was read: a request whose
        answer nobody waits for (the next request's answer tells what is held)."""
        refs = [GrantRef(shard_id=shard, attempt=attempt) for shard, attempt in grants]
        self.send(
            ProgressKind.REQUESTED, epoch, answered=False, dataset=self.dataset, given_back=refs
        )

    def request(
        self,
        epoch: int,
        quota: int | None = None,
        timeout_s: float = 10.0,
        read_shards: list[int] = (),
    ) -> ShardAssignment:
        """Ask for shards up to ``quota``; block until the sharder answers."""
        return self.wait_answer(self.ask(epoch, quota, read_shards), timeout_s)

    def started(self, epoch: int, shard_id: int, attempt: int, step: int | None = None) -> None:
        self.send(
            ProgressKind.STARTED,
            epoch,
            answered=False,
            shard_id=shard_id,
            attempt=attempt,
            step=step,
        )

    def done(self, epoch: int, shard_id: int, attempt: int, step: int | None = None) -> None:
        """The whole shard is trained (for a worker that does not commit samples; see
        :meth:`commit`)."""
        self.send(
            ProgressKind.DONE, epoch, answered=False, shard_id=shard_id, attempt=attempt, step=step
        )

    def failed(self, epoch: int, shard_id: int, attempt: int, error: str) -> None:
        self.send(
            ProgressKind.FAILED,
            epoch,
            answered=False,
            shard_id=shard_id,
            attempt=attempt,
            error=error,
        )

    def commit(
        self, epoch: int, commits: list, update_id: str | None = None, step: int | None = None
    ) -> int:
        """Samples whose update is in the model (``update_id`` None) or waits at the parameter
        servers.

        Only a commit with an ``update_id`` is answered (REFUSED, or what the
        worker holds): collect it with :meth:`wait_answer` or :meth:`answer_if_ready`.
        """
        return self.send(
            ProgressKind.COMMIT,
            epoch,
            answered=update_id is not None,
            commits=commits,
            update_id=update_id,
            step=step,
        )

    def checkpoint(self, epoch: int, step: int | None = None, timeout_s: float = 10.0) -> int:
        """The shard-state version to store with a model checkpoint."""
        return self.wait_answer(
            self.send(ProgressKind.CHECKPOINT, epoch, step=step), timeout_s
        ).version

    def rewind(self, epoch: int, version: int, timeout_s: float = 30.0) -> ShardAssignment:
        """Restore the job's shard state to ``version`` (after restoring the model checkpoint)."""
        return self.wait_answer(self.send(ProgressKind.REWIND, epoch, version=version), timeout_s)

    def flush(self, timeout_s: float = DELIVERY_BOUND_S) -> None:
        """Wait until every report sent so far is on the bus (before a checkpoint version is asked).

        BusError if one is still waiting after ``timeout_s`` or was dropped
        since the last flush: a version asked for now might not cover it. By
        default it waits until librdkafka has reported each one's fate.
        """
        remaining = self._producer.undelivered_after_flush(timeout_s)
        with self._failed_lock:
            failed, self._failed = self._failed, []
        if remaining or failed:
            raise BusError(
                f"worker {self.worker_id}: {remaining} record(s) undelivered "
                f"after {timeout_s:g} s, "
                f"{len(failed)} dropped ({', '.join(failed[:3]) or 'none'})"
            )

    def _delivered(self, error, message) -> None:
        """Delivery callback: a report the bus dropped is remembered for :meth:`flush` (and
        logged)."""
        if error is None:
            if message.topic() == self._progress_topic:
                self._last_delivered = TopicPartition(
                    message.topic(), message.partition(), message.offset()
                )
            return
        log.warning("worker %s: a report was not delivered: %s", self.worker_id, error.str())
        with self._failed_lock:
            self._failed.append(error.str())

    # ------------------------------------------------------------ closing

    def close(self, wait_read_s: float = CLOSE_WAIT_S) -> None:
        """Close once the sharder has read every report sent (at most ``wait_read_s``; 0: at
        once, for a client whose bus is known gone)."""
        if wait_read_s > 0:
            self.wait_until_read(wait_read_s)
        super().close()

    def wait_until_read(self, within_s: float = CLOSE_WAIT_S) -> bool:
        """Wait until the sharder's group has read past our last report; False if it has not
        within ``within_s``.

        Until then a bus reset can take the report from the log unread; this
        client sends it again (the last seconds of reports, as after any
        reset), which it no longer can once closed: its shard would wait out
        its lease, or be trained again.
        """
        deadline = time.monotonic() + within_s
        reader = None  # made once there is a report to ask about
        try:
            while True:
                self._after_bus_reset()
                self._producer.flush(max(0.0, deadline - time.monotonic()))
                last = self._last_delivered
                if last is None or _place(last) == self._read_through:
                    return True
                if reader is None:
                    reader = make_consumer(self._settings, group_id=self._settings.group("sharder"))
                if self._read_past(reader, last):
                    self._read_through = _place(last)  # asked again (at the close): known
                    return True
                if time.monotonic() >= deadline:
                    log.warning(
                        "worker %s: closing before the sharder read its last report (%s[%d]@%d)",
                        self.worker_id,
                        last.topic,
                        last.partition,
                        last.offset,
                    )
                    return False
                time.sleep(CLOSE_LOOK_EVERY_S)
        finally:
            if reader is not None:
                reader.close()

    @staticmethod
    def _read_past(reader, report: TopicPartition) -> bool:
        """Whether the group ``reader`` belongs to has committed past ``report``."""
        try:
            [committed] = reader.committed(
                [TopicPartition(report.topic, report.partition)], timeout=1.0
            )
        except KafkaException:  # the bus away a moment (a reset): look again
            return False
        return committed.offset > report.offset

    # ------------------------------------------------------------ receiving

    def wait_answer(self, seq: int, timeout_s: float = 10.0, flush: bool = True) -> ShardAssignment:
        """The answer to request ``seq``; answers from a fenced (older) sharder are ignored.

        ``flush`` first waits until everything sent is acknowledged; a caller
        collecting the answer to a request sent long ago skips that round trip.
        """
        if flush:
            self._producer.flush(timeout_s)
        else:
            self._producer.poll(0)
        deadline = time.monotonic() + timeout_s
        self._nudge_at = max(self._nudge_at, time.monotonic() + NUDGE_AFTER_S)
        try:
            while time.monotonic() < deadline:
                answer = self._take(seq)
                if answer is not None:
                    return answer
                self._poll_or_wait(min(0.05, max(0.001, deadline - time.monotonic())))
            answer = self._take(seq)
            if answer is not None:
                return answer
        finally:
            self._forget(seq)  # answered or not, nobody waits for it any more
        raise NoAnswer(
            f"no answer from the sharder to {self.worker_id}'s request {seq} "
            f"within {timeout_s:.0f} s"
        )

    def answer_if_ready(self, seq: int) -> ShardAssignment | None:
        """The answer to ``seq`` if it has arrived (reading what is there, without waiting), else
        None."""
        answer = self._take(seq)
        if answer is None:
            self._poll_or_wait(0.0)
            answer = self._take(seq)
        return answer

    def _take(self, seq: int) -> ShardAssignment | None:
        with self._arrived:
            answer = self._answers.pop(seq, None)
            if answer is not None:
                self._unwant(seq)
            return answer

    def _forget(self, seq: int) -> None:
        with self._arrived:
            self._unwant(seq)
            self._answers.pop(seq, None)

    def _unwant(self, seq: int) -> None:
        """Nobody waits for ``seq``'s answer any more; the reader stops once nobody waits for any
        (called under ``_arrived``)."""
        self._wanted.discard(seq)
        if not self._wanted:
            self._await_replies(False)

    def _poll_or_wait(self, timeout_s: float) -> None:
        """Read answers for every waiter, or wait while another thread does."""
        if not self._poll_lock.acquire(blocking=False):
            with self._arrived:
                self._arrived.wait(timeout_s)
            return
        try:
            self._after_bus_reset()
            if time.monotonic() >= self._nudge_at:
                self._nudge()
                self._nudge_at = time.monotonic() + NUDGE_EVERY_S
            arrived = []
            for message in poll_batch(self._consumer, 100, timeout_s):
                if message.key() != self._key or marker_id(message) is not None:
                    continue
                answer = self._usable_answer(message)
                if answer is None or answer.writer_epoch < self._highest_writer_epoch:
                    continue
                self._highest_writer_epoch = answer.writer_epoch
                arrived.append(answer)
            with self._arrived:
                for answer in arrived:
                    if answer.in_reply_to in self._wanted:
                        self._answers[answer.in_reply_to] = answer
                self._arrived.notify_all()
        finally:
            self._poll_lock.release()

    def _usable_answer(self, message) -> ShardAssignment | None:
        """The assignment in a record on our key, or None after dead-lettering a record that is
        none.

        A record that does not decode, is not an assignment, or is an
        assignment for another job or worker cannot be an answer to us
        (the sharder keys every answer by the worker it names); trusting
        it could hand us someone else's shards.
        """
        return decode_addressed(
            message,
            self.codec,
            self._deadletter,
            ShardAssignment,
            self.job_id,
            self.worker_id,
            "assignment",
        )

    @property
    def deadlettered(self) -> int:
        """Records on our key that were not usable answers (sent to the dead-letter topic)."""
        return self._deadletter.count

    def _nudge(self) -> None:
        """Append a marker to our answer partition: a late answer becomes readable.

        Some brokers (the embedded one) can leave a partition's last record
        invisible to fetches until the next write to that partition. The
        sharder's answers to one worker are the only writes to its key, so
        an answer could otherwise stay hidden until the request timed out.
        Readers skip markers; a slow sharder just sees a few extra records.
        """
        send_marker(self._producer, self._assignments_topic, self._key)
        self._producer.poll(0)


def _place(report: TopicPartition) -> tuple[str, int, int]:
    """Where a report lies in the log (TopicPartition's own equality ignores the offset)."""
    return report.topic, report.partition, report.offset
