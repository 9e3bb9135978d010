"""Mitigation commands on the worker side: verify, schedule, acknowledge.

:class:`CommandVerifier` is pure. It decides, in this order, whether a command
may be obeyed:

1. it is for this job and this worker (else REJECTED "wrong target");
2. with a signing key configured, it carries a valid HMAC (else REJECTED
   "unsigned" / "bad signature") - checked before the epoch so a forged
   command cannot raise the epoch the agent trusts;
3. its controller epoch is not older than the highest seen (else REJECTED
   "stale epoch": a fenced controller);
4. it has not expired (else REJECTED "expired");
5. its id was not seen before (else REJECTED "duplicate": a replay);
6. it is not a dry run (else IGNORED: published for audit only), nor a
   placement hint for the orchestrator (MARK_NODE_DEGRADED: IGNORED, the
   agent has nothing to do about its node).

Every rejection is counted by reason. :class:`CommandListener` reads the
worker's own partition of ``controller.commands`` (manual assignment, no
group), verifies, and queues accepted commands for the training thread,
which applies them at step boundaries (see :mod:`antdt.worker.agent`). A
record on the worker's key that is not a command at all (it does not decode,
or decodes into another type) cannot be acknowledged, since it has no id: it
goes to the dead-letter topic with its provenance and is counted.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime

from antdt.bus.clients import drain, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.deadletter import DeadLetter
from antdt.bus.markers import marker_id
from antdt.bus.readers import decode_or_deadletter, follow_key, poll_batch
from antdt.bus.watch import Rewinder, shared_watch
from antdt.control.signing import verify
from antdt.schemas.codec import Codec
from antdt.schemas.models import AckStatus, CommandAction, MitigationCommand
from antdt.settings import Settings
from antdt.topics import topic_spec, worker_key

log = logging.getLogger(__name__)

REMEMBERED_IDS = 10_000
#: How long the listener's thread waits in one poll: what closing it waits for at most, since a
#: poll cannot be woken. Commands are fetched by librdkafka's own thread at the background pace
#: either way. At 0.1 s the close took 12-98 ms of every rank's exit, at 0.02 s 3-21 ms (the
#: user-style job's ranks, bench/torchrun_bench.py, 6 exits each).
POLL_S = 0.02


@dataclass(frozen=True)
class Verdict:
    """Outcome of verification: obey (status None), or the ack to send and why."""

    status: AckStatus | None
    reason: str | None = None


ACCEPT = Verdict(None)


class CommandVerifier:
    """Decides whether a command may be obeyed (see the module docstring for the order)."""

    def __init__(
        self,
        job_id: str,
        worker_id: str,
        signing_key: bytes | None,
        clock=lambda: datetime.now(UTC),
    ):
        self.job_id, self.worker_id, self.signing_key = job_id, worker_id, signing_key
        self.clock = clock
        self.highest_epoch = 0
        self.rejected: Counter[str] = Counter()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def check(self, command: MitigationCommand) -> Verdict:
        verdict = self._check(command)
        if verdict.status is AckStatus.REJECTED:
            self.rejected[verdict.reason.split(":")[0]] += 1
        return verdict

    def _check(self, command: MitigationCommand) -> Verdict:
        if command.job_id != self.job_id or command.target_worker != self.worker_id:
            return Verdict(AckStatus.REJECTED, "wrong target")
        if self.signing_key is not None:
            if command.signature is None:
                return Verdict(AckStatus.REJECTED, "unsigned")
            if not verify(command, self.signing_key):
                return Verdict(AckStatus.REJECTED, "bad signature")
        if command.controller_epoch < self.highest_epoch:
            return Verdict(
                AckStatus.REJECTED,
                f"stale epoch: {command.controller_epoch} < {self.highest_epoch}",
            )
        if command.expires_at <= self.clock():
            return Verdict(AckStatus.REJECTED, "expired")
        if command.command_id in self._seen:
            return Verdict(AckStatus.REJECTED, "duplicate")
        self._remember(command)
        if command.dry_run:
            return Verdict(AckStatus.IGNORED, "dry run")
        if command.action is CommandAction.MARK_NODE_DEGRADED:
            return Verdict(AckStatus.IGNORED, "a placement hint for the orchestrator")
        return ACCEPT

    def _remember(self, command: MitigationCommand) -> None:
        self.highest_epoch = max(self.highest_epoch, command.controller_epoch)
        self._seen[command.command_id] = None
        while len(self._seen) > REMEMBERED_IDS:
            self._seen.popitem(last=False)


class CommandListener:
    """Reads this worker's commands on a background thread and hands accepted ones over."""

    def __init__(
        self,
        settings: Settings,
        job_id: str,
        worker_id: str,
        codec: Codec,
        verifier: CommandVerifier,
        on_verdict,
    ):
        self._topic = topic_spec("controller", "commands").full_name(settings.topic_prefix)
        self._key = worker_key(job_id, worker_id).encode()
        self._codec = codec
        self._verifier = verifier
        self._on_verdict = on_verdict
        self._settings = settings
        # one per worker: keep its idle cost low
        self._consumer = make_consumer(
            settings, client_id=f"antdt-agent-{worker_id}", pace=FetchPace.BACKGROUND
        )
        # Writes the positioning marker, then the dead letters (records on our key that are not
        # commands).
        self._producer = make_producer(settings, client_id=f"antdt-agent-{worker_id}")
        self._deadletter = DeadLetter.for_settings(self._producer, settings, "agent")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="antdt-commands", daemon=True)
        self._watch = shared_watch(settings)
        # after a bus reset, commands start at offset 0 again
        self._rewinder = Rewinder(self._consumer, self._watch)

    @property
    def deadlettered(self) -> int:
        """Records on this worker's key that did not decode into a command (sent to the dead-letter
        topic)."""
        return self._deadletter.count

    def start(self, timeout_s: float = 30.0) -> CommandListener:
        """Position at the end of the partition (proven with a marker), then listen."""
        for _ in follow_key(
            self._settings,
            self._consumer,
            self._producer,
            self._topic,
            self._key,
            timeout_s=timeout_s,
        ):
            pass  # commands from before this incarnation started are not ours to apply
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self._rewinder.check()
            for message in poll_batch(self._consumer, 100, POLL_S):
                if message.key() != self._key or marker_id(message) is not None:
                    continue  # another worker's command (the partition is shared), or a marker
                try:
                    self._handle(message)
                # a bug on one record must not end the thread: no later command would be heard
                except Exception:
                    log.exception("handling the command at offset %d failed", message.offset())

    def _handle(self, message) -> None:
        command = decode_or_deadletter(
            message, self._codec, self._deadletter, expected=MitigationCommand
        )
        if command is not None:
            self._on_verdict(command, self._verifier.check(command))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._consumer.close()
        self._watch.release()
        drain(self._producer, timeout_s=2.0)
