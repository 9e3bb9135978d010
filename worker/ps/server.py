"""``antdt ps``: one parameter-server shard.

Workers pull this shard's parameters and send it their gradients
(``prepare``); a gradient waits here, not applied, until the shard log
records its commit (the worker asks the sharder, :mod:`antdt.worker.commits`),
and is applied when this shard reads that APPLIED event: the model and the
log cannot disagree, and a sample is in the model exactly as often as the
log says. The ledger (:mod:`antdt.worker.ledger`) counts every applied
sample, in the same step as the parameters change.

Every shard saves a checkpoint at each CHECKPOINT event of the log (shard 0
asks for one every ``checkpoint_every_s``), so all shards hold the same
versions. A shard that restarts, or finds seqs missing from the log, loads
its latest checkpoint and asks the sharder to rewind to it; every shard
reloads that version when the REWOUND event reaches it, and the samples
applied after it are granted again. A rewind abandons the versions after its
target: they are deleted, and a restarted shard first reads the rewinds it
missed, so it never asks for an abandoned one. A shard told to rewind to a
version it does not have (it was down when that checkpoint was taken) goes
back to its latest older one and asks for that: the shards meet on the
newest version they all have.

States (the shard's state machine)::

    WAITING    --a worker's initial values, then the first checkpoint--> SERVING
    start with a checkpoint, or a gap in the log                  --> RECOVERING
    RECOVERING --a REWOUND read in the log, its checkpoint loaded--> SERVING
    RECOVERING --its rewind answered REFUSED: the job's shard state is lost-->
               exits with EXIT_STATE_LOST (78): a restart cannot help
    SERVING    --a RESTART or EVICT command for it--> LEAVING
    LEAVING    --a checkpoint saved after the command (or LEAVE_WITHIN_S)-->
               exits with the agent's exit code

Only a SERVING shard takes gradients. A LEAVING one (the controller moves a
slow shard to another node) asks for a checkpoint and keeps applying what is
committed until it has saved it, so its replacement starts from the newest
version and rolls the job back by as little as possible. A shard that cannot
follow the log (a REWOUND to a version it has no checkpoint of, or no
REWOUND within ``recover_within_s``) exits with one line; its restart rolls
everyone back.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from antdt.bus.clients import make_producer
from antdt.bus.watch import shared_watch
from antdt.errors import AntdtError, ShardStateLost
from antdt.schemas.codec import make_codec
from antdt.schemas.models import AssignmentStatus, ProgressKind, ShardLogEvent
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.eventlog import LogReads
from antdt.settings import Settings
from antdt.worker.agent import Agent, WorkerExit
from antdt.worker.ps import metrics, wire
from antdt.worker.ps.checkpoints import CheckpointStore
from antdt.worker.ps.follower import LogFollower, Order, Position
from antdt.worker.ps.model import ShardModel
from antdt.worker.shard_client import ShardClient

log = logging.getLogger(__name__)

#: Updates waiting this long with their commit not yet read are late enough to nudge the log
#: partition.
NUDGE_AFTER_S = 0.2
#: ... and nudging stops for an update this old (its commit was refused, or its worker died before
#: sending it).
NUDGE_FOR_S = 10.0
#: A shard told to restart waits this long at most for its last checkpoint before it exits anyway.
LEAVE_WITHIN_S = 10.0
#: A worker's connection that carries no request this long is closed (its worker reconnects at its
#: next request, as after a shard's restart): a worker's host gone without closing it leaves no
#: thread waiting for good. Past a PAUSE's default limit (600 s), when a worker sends nothing.
IDLE_CONNECTION_S = 900.0


class ServerState(str, Enum):
    """A shard's state; the transitions are in the module docstring."""

    WAITING = "WAITING"
    RECOVERING = "RECOVERING"
    SERVING = "SERVING"
    LEAVING = "LEAVING"


class ServerFailure(AntdtError):
    """The shard cannot go on consistently with the others; its restart will roll them back."""


@dataclass(frozen=True)
class ServerSpec:
    """One shard's place in the job and its knobs."""

    job_id: str
    checkpoint_dir: Path
    shard: int = 0
    shards: int = 1
    host: str = "0.0.0.0"
    port: int = 9500
    out_dir: Path | None = None  # ledger files (ledger-epoch<E>.npy) when an epoch closes
    lr: float = 0.05
    momentum: float = 0.0
    checkpoint_every_s: float = 5.0
    max_staleness: int | None = None
    pending_ttl_s: float = 300.0
    recover_within_s: float = 90.0
    # obey the controller's RESTART and EVICT (the agent listens for commands)
    commands: bool = True
    #: The name the shard reports under and is commanded by (default ``ps-<shard>``); on Kubernetes
    #: the pod's name, which the remediation deletes on RESTART so the StatefulSet starts it again
    #: on another node.
    agent_id: str | None = None
    #: Demos and tests: the seconds each piece of work ("pull", "prepare", "apply") lasts at least
    #: now, as on a slower or contended machine; the shard then does one piece at a time, as one
    #: busy machine would.
    pace: Callable[[str], float] | None = None

    @property
    def name(self) -> str:
        return f"ps-{self.shard}"


@dataclass
class _Pending:
    gradient: torch.Tensor
    samples: int
    received: float


class ParameterServer:
    """One shard: a TCP front for workers, and the log follower that applies committed updates."""

    def __init__(self, settings: Settings, spec: ServerSpec):
        self.settings, self.spec = settings, spec
        self.model = ShardModel(spec.lr, spec.momentum)
        self.store = CheckpointStore(spec.checkpoint_dir / spec.name)
        self.state = ServerState.WAITING
        self.epoch = 0
        self.pending: dict[str, _Pending] = {}
        self.failure: ServerFailure | ShardStateLost | None = None
        self._codec = make_codec(settings.schema_registry_url)
        self._stop = threading.Event()
        self._listener = socket.create_server((spec.host, spec.port), reuse_port=False)
        self._listener.settimeout(0.5)
        self._client: ShardClient | None = None
        self._follower: LogFollower | None = None
        self._watch = None
        self._agent: Agent | None = None
        self._threads: list[threading.Thread] = []
        self._recovering_since = 0.0
        self._rewind: tuple[int, int] | None = None  # the rewind asked for: (version, its seq)
        self._asked_first_checkpoint = False
        self._last_checkpoint_ask = 0.0
        self._last_nudge = self._last_apply = 0.0
        self._machine = threading.Lock() if spec.pace is not None else nullcontext()
        self._leaving: WorkerExit | None = None  # the command that ends this shard, once one came
        self._leave_by = 0.0
        #: Set when the shard has left (RESTART or EVICT): :meth:`run` ends with it.
        self.exit: WorkerExit | None = None
        #: Set once started (its threads take workers and follow the log) until closed: the
        #: process's ``/readyz``, as a service's.
        self.ready = threading.Event()

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    @property
    def serving(self) -> bool:
        return self.state is ServerState.SERVING

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ParameterServer:
        settings = self.settings.model_copy(update={"job_id": self.spec.job_id})
        self._agent = Agent(
            settings=settings,
            worker_id=self.spec.agent_id or self.spec.name,
            role="ps",
            listen_for_commands=self.spec.commands,
            batch_size=0,
        ).__enter__()
        self._client = self._agent.shard_client
        self._watch = shared_watch(settings, look_now=True)
        start, position = self._resume()
        self._follower = LogFollower(settings, self.spec.job_id, self._codec, start, position)
        for target, name in (
            (self._accept_loop, "antdt-ps-accept"),
            (self._follow_loop, "antdt-ps-follow"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.ready.set()
        return self

    def _resume(self) -> tuple[int, Position]:
        """Where the log is read from: the start, or just past the CHECKPOINT of the newest
        checkpoint.

        Offsets name places in one cluster's log only: after a bus reset the
        log starts again at offset 0, and it is read from there (events seen
        already are skipped by their seqs).
        """
        latest = self.store.latest()
        if latest is None:
            return 0, Position()
        saved = self.store.load(latest)
        same_log = (
            saved.get("cluster_id") is not None
            and saved.get("cluster_id") == self._watch.cluster_id
        )
        start, position = (
            saved["log_offset"] + 1 if same_log else 0,
            Position(saved["writer_epoch"], latest),
        )
        target, start = self._rewinds_missed(latest, start, position)
        self._load(target)
        self._enter_recovery(target, f"restarted from the checkpoint at version {target}")
        return start, position

    def _rewinds_missed(self, version: int, start: int, position: Position) -> tuple[int, int]:
        """Read the log to its end: a rewind after ``version`` to an older one abandoned it (and
        what came after).

        Returns the version to go back to and the offset to follow the log from.
        """
        producer = make_producer(self.settings, client_id=f"antdt-{self.spec.name}-catch-up")
        try:
            reads = LogReads(self.settings, self._codec, producer)
            for offset, event in reads.job_log(self.spec.job_id, start):
                start = offset + 1
                if (
                    position.place(event) is not Order.SKIP
                    and event.transition is T.REWOUND
                    and event.version < version
                ):
                    version = self._newest_at_most(event.version)
        finally:
            producer.flush(2)
        return version, start

    def _newest_at_most(self, version: int) -> int:
        """This shard's newest version not after ``version`` (newer ones were abandoned and are
        deleted)."""
        self.store.forget_after(version)
        newest = self.store.latest()
        if newest is None:
            raise ServerFailure(
                f"{self.spec.name} has no checkpoint at or before version {version}"
            )
        return newest

    def _load(self, version: int) -> None:
        saved = self.store.load(version)
        self.model.load_state_dict(saved["model"])
        self.epoch = saved["epoch"]

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set (or the shard fails); then close."""
        try:
            while not stop.wait(0.2) and self.failure is None and self.exit is None:
                pass
        finally:
            self.close()
        if self.failure is not None:
            raise self.failure
        if self.exit is not None:
            raise self.exit

    def close(self) -> None:
        self.ready.clear()
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._listener.close()
        if self._follower is not None:
            self._follower.close()
        if self._watch is not None:
            self._watch.release()
        if self._agent is not None:
            self._agent.__exit__(None, None, None)

    # ------------------------------------------------------------ workers

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(IDLE_CONNECTION_S)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._serve, args=(connection,), name="antdt-ps-conn", daemon=True
            ).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            while not self._stop.is_set():
                try:
                    header, payload = wire.receive(connection)
                    with self._machine:
                        started = time.perf_counter()
                        reply, values = self._handle(header, payload)
                        self._pace(header.get("op"), started)
                    wire.send(connection, reply, values)
                except wire.WireError:
                    # the worker went away; its pending updates wait for their commit or expire
                    return
                except Exception as exc:  # noqa: BLE001 - a bad request is answered, the server goes on
                    try:
                        wire.send(
                            connection, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                        )
                    except wire.WireError:
                        return

    def _handle(
        self, header: dict, payload: torch.Tensor | None
    ) -> tuple[dict, torch.Tensor | None]:
        op = header.get("op")
        if op == "hello":
            return {
                "ok": True,
                "job": self.spec.job_id,
                "shard": self.spec.shard,
                "shards": self.spec.shards,
                "state": self.state.value,
                "initialized": self.model.initialized,
            }, None
        if op == "init":
            if payload is None:
                raise AntdtError("init without values")
            fresh = self.model.initialize(header["signature"], payload)
            if fresh:
                log.info(
                    "%s initialized by %s (%d values)",
                    self.spec.name,
                    header.get("worker"),
                    payload.numel(),
                )
            return {"ok": True, "fresh": fresh}, None
        if op == "pull":
            if not self.model.initialized:
                return {"ok": False, "retry": True, "reason": "not initialized"}, None
            version, values = self.model.values()
            return {"ok": True, "version": version, "state": self.state.value}, values
        if op == "prepare":
            return self._prepare(header, payload), None
        if op == "abort":
            self.pending.pop(header["update_id"], None)
            return {"ok": True}, None
        raise AntdtError(f"unknown request {op!r}")

    def _prepare(self, header: dict, gradient: torch.Tensor | None) -> dict:
        """Hold a gradient until its commit is read in the log (or refuse it: the worker then does
        not commit)."""
        if not self.serving:
            return {
                "ok": False,
                "retry": True,
                "reason": f"{self.spec.name} is {self.state.value.lower()}",
            }
        if gradient is None:
            raise AntdtError("prepare without a gradient")
        base = header.get("base_version")
        bound = self.spec.max_staleness
        if bound is not None and base is not None and self.model.version - base > bound:
            metrics.STALE.inc()
            return {
                "ok": False,
                "stale": True,
                "reason": f"computed {self.model.version - base} updates ago (bound {bound})",
            }
        self.pending[header["update_id"]] = _Pending(
            gradient, int(header.get("samples", 0)), time.monotonic()
        )
        metrics.PENDING.set(len(self.pending))
        return {"ok": True}

    # ------------------------------------------------------------ the log

    def _follow_loop(self) -> None:
        try:
            while not self._stop.is_set() and self.exit is None:
                for offset, event, order in self._follower.poll(0.05):
                    self._take(offset, event, order)
                    if self.exit is not None:
                        return  # left: what follows is its replacement's to read
                self._housekeeping()
        except (ServerFailure, ShardStateLost) as exc:
            self.failure = exc
        except Exception as exc:  # noqa: BLE001 - reported by run(), which stops the process
            log.exception("the log follower failed")
            self.failure = ServerFailure(f"{type(exc).__name__}: {exc}")

    def _take(self, offset: int, event: ShardLogEvent, order: Order) -> None:
        if order is Order.SKIP:
            return
        if order is Order.GAP and self.state is not ServerState.RECOVERING:
            self._roll_back(f"seqs before {event.seq} are missing from the log")
        if event.transition is T.DATASET_DEFINED:
            self.model.define_ledger(event.dataset.size, event.dataset.epochs)
        elif event.transition is T.EPOCH_OPENED:
            self.epoch = event.epoch
        elif event.transition is T.REWOUND:
            self._rewound(event)
        elif self.state is ServerState.RECOVERING:
            return  # the state is a checkpoint's until the REWOUND arrives: nothing after it counts
        elif event.transition is T.APPLIED and event.update_id is not None:
            self._apply(event)
        elif event.transition is T.CHECKPOINT:
            self._checkpoint(offset, event)
        elif event.transition is T.EPOCH_CLOSED:
            self._write_ledger(event.epoch)

    def _apply(self, event: ShardLogEvent) -> None:
        update = self.pending.pop(event.update_id, None)
        if update is None:
            self._roll_back(
                f"update {event.update_id} is committed "
                f"but its gradient never reached {self.spec.name}"
            )
            return
        samples = [s for commit in event.commits for s in commit.samples]
        if update.samples and update.samples != len(samples):
            log.error(
                "update %s: prepared for %d samples, committed with %d",
                event.update_id,
                update.samples,
                len(samples),
            )
        with self._machine:
            started = time.perf_counter()
            self.model.apply(update.gradient, event.epoch, samples)
            self._pace("apply", started)
            elapsed = time.perf_counter() - started
        self._last_apply = time.monotonic()
        self._agent.queue_depth = len(self.pending)
        try:
            self._agent.record(elapsed, len(samples))
        # the controller restarts or evicts this shard: leave with a checkpoint
        except WorkerExit as exc:
            self._begin_leaving(exc)
        metrics.APPLIED.inc()
        metrics.PENDING.set(len(self.pending))

    def _pace(self, work: str | None, started: float) -> None:
        """Hold until ``work`` begun at ``started`` has lasted what ``spec.pace`` says (nothing
        without it)."""
        if self.spec.pace is not None and work is not None:
            remaining = started + self.spec.pace(work) - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)

    def _checkpoint(self, offset: int, event: ShardLogEvent) -> None:
        if not self.model.initialized:
            return
        position = self._follower.position
        self.store.save(
            event.seq,
            {
                "model": self.model.state_dict(),
                "epoch": self.epoch,
                "log_offset": offset,
                "writer_epoch": position.writer_epoch,
                "cluster_id": self._watch.cluster_id,
            },
        )
        metrics.CHECKPOINTS.inc()
        if self.state is ServerState.LEAVING:
            self._leave(f"checkpoint at version {event.seq} saved")
        elif self.state is ServerState.WAITING:
            self._become(ServerState.SERVING)
            log.info("%s serving (first checkpoint at version %d)", self.spec.name, event.seq)

    def _rewound(self, event: ShardLogEvent) -> None:
        """Every shard goes back to the version (the samples after it are granted again).

        A WAITING shard has applied nothing yet: it stays as it is. A shard
        without that version goes back to its newest older one and asks
        every shard to follow (the module docstring).
        """
        if self.state is ServerState.WAITING:
            return
        if self._leaving is not None:
            self._leave(f"rewound at seq {event.seq}: its replacement recovers from its checkpoint")
            return
        metrics.ROLLBACKS.inc()
        version = self._newest_at_most(event.version)
        self._load(version)
        if version != event.version:
            self._enter_recovery(
                version, f"version {event.version} (rewound at seq {event.seq}) is not here"
            )
            return
        self._become(ServerState.SERVING)
        log.warning(
            "%s back at version %d (rewound at seq %d by %s)",
            self.spec.name,
            event.version,
            event.seq,
            event.worker_id,
        )

    def _roll_back(self, why: str) -> None:
        latest = self.store.latest()
        if latest is None:
            raise ServerFailure(
                f"{self.spec.name}: {why}, and it has no checkpoint to roll back to"
            )
        self._load(latest)
        self._enter_recovery(latest, why)

    def _begin_leaving(self, command: WorkerExit) -> None:
        log.warning("%s leaving (%s): asking for a last checkpoint", self.spec.name, command.reason)
        self._leaving, self._leave_by = command, time.monotonic() + LEAVE_WITHIN_S
        self._become(ServerState.LEAVING)
        self._ask_checkpoint()

    def _leave(self, why: str) -> None:
        log.warning("%s leaves: %s", self.spec.name, why)
        self.exit = self._leaving

    def _enter_recovery(self, version: int, why: str) -> None:
        """Ask the sharder to rewind to ``version``; until the REWOUND is read, nothing is
        applied."""
        log.warning("%s: %s; rolling back to version %d", self.spec.name, why, version)
        self._become(ServerState.RECOVERING)
        self._recovering_since = time.monotonic()
        self._rewind = (
            version,
            self._client.send(ProgressKind.REWIND, self.epoch, answered=True, version=version),
        )

    def _check_rewind_answer(self) -> None:
        """A refused rewind ends a recovering shard with :class:`ShardStateLost`; any other answer
        is only an acknowledgement (the REWOUND event in the log is what recovers), taken all the
        same so that the client does not keep it."""
        if self._rewind is None:
            return
        version, seq = self._rewind
        answer = self._client.answer_if_ready(seq)
        if answer is None:
            return
        self._rewind = None
        if answer.status is AssignmentStatus.REFUSED and self.state is ServerState.RECOVERING:
            raise ShardStateLost(
                f"{self.spec.name}: the sharder refused to rewind job {self.spec.job_id} to "
                f"version {version} ({answer.reason}): the job's shard state is lost, and a "
                "restart cannot recover it; start the job again"
            )

    def _become(self, state: ServerState) -> None:
        self.state = state
        metrics.SERVING.set(int(state is ServerState.SERVING))

    def _write_ledger(self, epoch: int) -> None:
        if self.spec.out_dir is not None and self.model.ledger is not None:
            self.model.ledger.write(self.spec.out_dir / self.spec.name, [epoch])

    # ------------------------------------------------------------ housekeeping

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if self._leaving is not None and self.exit is None and now > self._leave_by:
            self._leave(
                f"no checkpoint within {LEAVE_WITHIN_S:.0f} s: "
                "its replacement rolls the job back further"
            )
        self._check_rewind_answer()
        if (
            self.state is ServerState.RECOVERING
            and now - self._recovering_since > self.spec.recover_within_s
        ):
            raise ServerFailure(
                f"{self.spec.name}: no REWOUND in the log within {self.spec.recover_within_s:.0f} s"
            )
        if (
            self.state is ServerState.WAITING
            and self.model.initialized
            and self.model.ledger is not None
            and not self._asked_first_checkpoint
        ):
            self._asked_first_checkpoint = True
            self._ask_checkpoint()
        elif (
            self.serving
            and self.spec.shard == 0
            and now - self._last_checkpoint_ask >= self.spec.checkpoint_every_s
        ):
            self._ask_checkpoint()
        self._expire(now)
        self._nudge(now)

    def _ask_checkpoint(self) -> None:
        self._last_checkpoint_ask = time.monotonic()
        self._client.send(ProgressKind.CHECKPOINT, self.epoch, answered=False)

    def _expire(self, now: float) -> None:
        expired = [
            u for u, p in list(self.pending.items()) if now - p.received > self.spec.pending_ttl_s
        ]
        for update in expired:
            self.pending.pop(update, None)
        if expired:
            metrics.EXPIRED.inc(len(expired))
            metrics.PENDING.set(len(self.pending))

    def _nudge(self, now: float) -> None:
        """Nudge while the log may hold something back: an update waits, or one was applied a moment
        ago.

        (After the last update of an epoch comes its EPOCH_CLOSED, which may be
        the partition's last record for a while.) An update whose commit was
        refused or never sent stops counting after ``NUDGE_FOR_S`` and expires.
        """
        waiting = [
            now - p.received for p in list(self.pending.values()) if now - p.received < NUDGE_FOR_S
        ]
        recent = NUDGE_AFTER_S < now - self._last_apply < NUDGE_FOR_S
        if ((waiting and max(waiting) > NUDGE_AFTER_S) or recent) and now - self._last_nudge > 0.5:
            self._last_nudge = now
            self._follower.nudge()
