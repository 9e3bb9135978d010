"""The Agent: what a training script embeds to take part in antdt.

A training script adds about ten lines (under torchrun, a training mode's
job does all of this: :class:`~antdt.worker.elastic.job.ElasticJob` for a
DDP loop, :class:`~antdt.worker.preduce.job.PartialReduceJob`,
:class:`~antdt.worker.ps.job.ParameterServerJob`)::

    with Agent(job_id="resnet", worker_id=f"rank-{rank}") as agent:
        data = agent.shards(train_set, DatasetSpec(...))   # dynamic sharding
        batches = loader(data, batch_size=agent.batch_size)  # antdt.worker.dataset.loader
        while not data.finished:
            for batch in agent.iterate(batches):  # times data waits, keeps provenance
                loss = model(batch).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                agent.step(samples=len(batch))  # commits the batch; commands apply here

What the agent does meanwhile, off the training thread: aggregates step
timings into one ``WorkerMetrics`` per report interval, samples resources,
sends heartbeats, listens for commands. :meth:`Agent.step` costs a few
microseconds plus, with sharded data, one commit sent to the bus without
waiting: it records one tuple and looks at an (almost always empty) inbox.

A sample counts as trained once its update is in the model. ``iterate``
takes each sample's provenance off the data; ``step`` commits the samples
iterated since the last step (the optimizer step has run by then). With a
parameter server the update is applied later, by the servers: the
parameter-server client takes the tags itself (:meth:`take_tags`) and
commits them as a pending update (:mod:`antdt.worker.ps`).

States (the agent's state machine)::

    CREATED --enter--> RUNNING --PAUSE--> PAUSED --RESUME--> RUNNING
    RUNNING/PAUSED --exit, RESTART or EVICT--> STOPPED

RESTART and EVICT end the process with a distinctive exit code
(:data:`EXIT_RESTART`, :data:`EXIT_EVICTED`) after the registered
``on_restart`` callbacks (checkpointing) ran, so an orchestrator knows to
start the worker again elsewhere, or not at all.

Under torchrun the agent takes its identity from torchrun's variables
(:mod:`antdt.worker.elastic.env`): RESTART's exit is a failure torchrun
restarts the worker group for (``--max-restarts``), and EVICT stops the
node's torchrun agent as well, so in an elastic job (``--nnodes MIN:MAX``)
the other nodes meet again without it.

Prometheus metrics of the agent itself (steps, time split, events sent,
dropped and pending, report lag, commands applied and refused, its own
overhead) are kept in :attr:`Agent.metrics`; ``ANTDT_AGENT_METRICS_PORT``
serves them on ``/metrics`` (:mod:`antdt.worker.agent_metrics`).

Timing on CUDA: kernels run after the calls that queue them return, so the
device's queued work is waited for when synchronisation starts
(:meth:`Agent.sync_wait`); it is booked as compute, the collective's own
time as synchronisation.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from antdt.bus.admin import look_at_bus
from antdt.errors import ShardStateLost
from antdt.schemas.codec import make_codec
from antdt.schemas.models import (
    WORKER_ROLE,
    AckStatus,
    CommandAck,
    CommandAction,
    LifecycleEvent,
    MitigationCommand,
    WorkerLifecycle,
    WorkerMetrics,
)
from antdt.schemas.types import utc_now
from antdt.settings import Settings, load_settings
from antdt.topics import topic_spec
from antdt.worker.agent_metrics import AgentMetrics, metrics_port
from antdt.worker.commands import ACCEPT, CommandListener, CommandVerifier, Verdict
from antdt.worker.elastic.env import TorchrunEnv
from antdt.worker.emitter import EventEmitter
from antdt.worker.steps import StepRecord, settle_device, summarize

if TYPE_CHECKING:
    from antdt.worker.dataset import ShardedDataset  # imports torch: only when shards() is used

log = logging.getLogger(__name__)

#: Exit code asking the orchestrator to restart this worker (elsewhere).
EXIT_RESTART = 75
#: Exit code of a worker the controller evicted: do not restart it.
EXIT_EVICTED = 76
#: Exit code of a process whose job's state is lost (a parameter server the sharder cannot rewind):
#: a restart cannot help, the job must be started again.
EXIT_STATE_LOST = ShardStateLost.exit_code
#: How long a listening agent's first look at the bus may take (its listener's positioning bound).
LOOK_UP_WITHIN_S = 30.0
#: A job id (the settings' pattern).
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class AgentState(str, Enum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"


class WorkerExit(SystemExit):
    """Raised from :meth:`Agent.step` to end the process on RESTART or EVICT."""

    def __init__(self, code: int, reason: str):
        super().__init__(code)
        self.reason = reason


@dataclass
class AgentSpec:
    """Who the agent is and how often it reports."""

    job_id: str
    worker_id: str
    rank: int | None = None
    host: str = field(default_factory=socket.gethostname)
    node_id: str | None = None
    report_interval_s: float = 1.0
    heartbeat_interval_s: float = 5.0
    device: int | None = None
    launch: TorchrunEnv | None = None  # set when torchrun started this process
    world_size: int | None = None  # ranks in the synchronous group, when known

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        job_id=None,
        worker_id=None,
        rank=None,
        node_id=None,
        device=None,
        world_size=None,
    ) -> AgentSpec:
        """Fill what the script did not say from settings and the launcher's variables.

        Under torchrun: the rank is ``RANK``, the worker ``<node>-<LOCAL_RANK>``
        (stable across restarts and re-rendezvous), the job a named run's id
        (``--rdzv-id``, or ``--standalone``'s) unless ``ANTDT_JOB_ID`` is set,
        and the device ``LOCAL_RANK`` when the script uses CUDA. Otherwise
        ``RANK`` and ``NODE_NAME`` as other launchers set them.
        """
        launch = TorchrunEnv.detect()
        if rank is None and launch is not None:
            rank = launch.rank
        elif rank is None and os.environ.get("RANK", "").isdigit():
            rank = int(os.environ["RANK"])
        node = node_id or settings.node_id or os.environ.get("NODE_NAME") or socket.gethostname()
        worker = worker_id or settings.worker_id or _default_worker_id(launch, node, rank)
        job = job_id or _default_job_id(settings, launch)
        if device is None and launch is not None and _has_cuda_device(launch.local_rank):
            device = launch.local_rank
        if world_size is None and launch is not None:
            world_size = launch.world_size
        elif world_size is None and os.environ.get("WORLD_SIZE", "").isdigit():
            world_size = int(os.environ["WORLD_SIZE"])
        return cls(
            job,
            worker,
            rank,
            socket.gethostname(),
            node,
            settings.report_interval_s,
            settings.heartbeat_interval_s,
            device,
            launch,
            world_size,
        )


def _default_worker_id(launch: TorchrunEnv | None, node: str, rank: int | None) -> str:
    if launch is not None:
        return launch.worker_id(node)
    return f"rank-{rank}" if rank is not None else socket.gethostname()


def _default_job_id(settings: Settings, launch: TorchrunEnv | None) -> str:
    if "job_id" in settings.model_fields_set or launch is None or not launch.named_run:
        return settings.job_id
    run = launch.run_id
    return run if JOB_ID.fullmatch(run) else settings.job_id


def _has_cuda_device(index: int) -> bool:
    """Whether this process's torch (if imported at all) has CUDA device ``index``: never imports
    torch itself.

    A host with fewer GPUs than local ranks trains some ranks on the CPU: they report no GPU.
    """
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and index < torch.cuda.device_count()


class Agent:
    """Instruments training, pulls shards, obeys commands. Use it as a context manager."""

    def __init__(
        self,
        job_id: str | None = None,
        worker_id: str | None = None,
        rank: int | None = None,
        node_id: str | None = None,
        *,
        settings: Settings | None = None,
        batch_size: int = 32,
        shard_quota: int = 2,
        device: int | None = None,
        listen_for_commands: bool = True,
        role: str = WORKER_ROLE,
        world_size: int | None = None,
    ):
        self.settings = settings or load_settings()
        self.spec = AgentSpec.from_settings(
            self.settings, job_id, worker_id, rank, node_id, device, world_size
        )
        self.incarnation = uuid.uuid4().hex
        self.state = AgentState.CREATED
        self.step_count = 0
        self.batch_size = batch_size
        self.shard_quota = shard_quota
        self.exit_reason: str | None = None
        self.role = role
        #: Updates waiting to be applied, reported with the metrics (a parameter server sets it).
        self.queue_depth: int | None = None
        self._listen = listen_for_commands
        self._tags: list = []  # provenance of the samples iterated since the last step
        #: How long trained samples may wait before their commit is sent (0: every step). A
        #: synchronous job rewinds to its checkpoint on any failure, so it loses nothing by sending
        #: fewer, larger commits (ElasticJob: ``COMMIT_EVERY_S``; a commit a step was 300 records/s
        #: a rank).
        self.commit_every_s = 0.0
        self._trained: list = []  # tags of samples in the model whose commit is not sent yet
        self._committed_at = time.perf_counter()
        self._shard_client = None
        self._committer = None
        self._records: deque[StepRecord] = deque()
        #: The last step's record (None before the first): what a caller's own trace reads.
        self.last_step: StepRecord | None = None
        self._injected_s = 0.0  # the last step's injected slowdown
        self._booking: set[str] = set()  # the accounts a context is timing now
        self._stepped = False  # this process has finished a step
        self._inbox: deque[MitigationCommand] = deque()
        self._mark = time.perf_counter()
        self._data_wait = 0.0
        self._sync_wait = 0.0
        self._resumed = threading.Event()
        self._paused_by: MitigationCommand | None = None  # the PAUSE holding training, and until
        self._pause_until = 0.0
        self._stop = threading.Event()
        # set by the first step (and the exit): the reporter sends the opening window at once
        self._wake = threading.Event()
        self._batch_size_callbacks: list[Callable[[int], None]] = []
        self._quota_callbacks: list[Callable[[int], None]] = []
        self._restart_callbacks: list[Callable[[], None]] = []
        self._custom: dict[str, Callable[[MitigationCommand], None]] = {}
        self._handlers: dict[CommandAction, Callable[[MitigationCommand], None]] = {}
        self._seq = 0
        # the reporter thread and the training thread (a restore, the exit) both report
        self._report_lock = threading.Lock()
        self._window_start = None
        codec = make_codec(self.settings.schema_registry_url)
        self._codec = codec
        self._emitter = EventEmitter(
            self.settings, client_id=f"antdt-agent-{self.spec.worker_id}", codec=codec
        )
        key = (
            self.settings.signing_key.get_secret_value().encode()
            if self.settings.signing_key
            else None
        )
        self.verifier = CommandVerifier(self.spec.job_id, self.spec.worker_id, key)
        self._listener: CommandListener | None = None
        #: Seconds the training thread spent in step() itself: the agent's overhead.
        self.overhead_s = 0.0
        #: This agent's Prometheus registry, served when ANTDT_AGENT_METRICS_PORT is set.
        self.metrics = AgentMetrics(self, self._emitter)
        # made by shards(): their shard clients' dead letters count as ours
        self._datasets: list[ShardedDataset] = []
        self._reporter = threading.Thread(
            target=self._report_loop, name="antdt-reporter", daemon=True
        )
        self._sampler = None
        self._injector = None
        prefix = self.settings.topic_prefix
        self._topics = {
            name: topic_spec(c, n).full_name(prefix)
            for name, (c, n) in {
                "metrics": ("worker", "metrics"),
                "lifecycle": ("worker", "lifecycle"),
                "acks": ("worker", "acks"),
            }.items()
        }

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Agent:
        # first: a worker stuck starting (the bus away) is one an operator wants to see
        self.metrics.start(
            metrics_port(self.settings.agent_metrics_port),
            lambda: self.state in (AgentState.RUNNING, AgentState.PAUSED),
        )
        self._sampler = _make_sampler(self.spec.device)
        self._injector = _make_injector(self.settings, self.spec.rank)
        if self._listen:
            try:
                # a listening agent waits for the bus anyway: it looks before any other client
                # exists (its event producer, its listener's three)
                look_at_bus(self.settings, LOOK_UP_WITHIN_S)
            except BaseException:
                self._close_parts(flush_timeout_s=0.0)
                raise
        self._emitter.start()
        self._lifecycle(LifecycleEvent.JOINED)
        if self._listen:
            try:
                self._listener = CommandListener(
                    self.settings,
                    self.spec.job_id,
                    self.spec.worker_id,
                    self._codec,
                    self.verifier,
                    self._on_verdict,
                ).start()
            # e.g. a refused login: leave no thread or retrying producer behind
            except BaseException:
                # nothing queued can be delivered: do not wait for it
                self._close_parts(flush_timeout_s=0.0)
                raise
        self.state = AgentState.RUNNING
        self._mark = time.perf_counter()
        self._reporter.start()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            code = 0 if exc is None else 1
        reason = self.exit_reason or (
            "finished" if code == 0 else f"{exc_type.__name__}: {exc}"[:500]
        )
        self.state = AgentState.STOPPED
        self._stop.set()
        self._wake.set()
        if self._reporter.is_alive():
            self._reporter.join(5)
        self._report()  # the last partial interval
        self.commit_trained()  # in the model already: before the shards are handed back
        if self._shard_client is not None:
            # LEFT hands the shards back on another topic: read after the commits, it could
            # re-grant a shard to another worker before its last commit is recorded
            self._shard_client.wait_until_read()
        self._lifecycle(LifecycleEvent.LEFT, exit_code=code, reason=reason)
        self._close_parts()
        if code == EXIT_EVICTED and self.spec.launch is not None:
            from antdt.worker.elastic.leave import leave_torchrun_job

            leave_torchrun_job()

    def _close_parts(self, flush_timeout_s: float = 5.0) -> None:
        self.metrics.stop()
        if self._shard_client is not None:
            self._shard_client.close()
        if self._listener is not None:
            self._listener.close()
        if self._injector is not None:
            self._injector.close()
        if self._sampler is not None:
            self._sampler.close()
        self._emitter.close(flush_timeout_s)

    # ------------------------------------------------------------ the training thread

    def step(self, samples: int | None = None) -> StepRecord:
        """Mark the end of one training step (its update applied): commit its samples, apply due
        commands; returns the step's record (its time split).

        An injected slowdown (``ANTDT_SLOWDOWN``, sleep mode) is booked as
        compute, as a slower device's would be. It spares the process's first
        step: its one-time costs (imports, the first allocations) are not the
        device's speed, as the monitor's warm-up says, and multiplied they
        would hold a slowed worker back for seconds before it first reports.
        """
        started = time.perf_counter()
        data, sync = self._data_wait, self._sync_wait
        compute = started - self._mark - data - sync
        warm, self._stepped = self._stepped, True
        if not warm:
            self._wake.set()  # the opening report: one-off costs in a window of their own
        injected = 0.0
        if self._injector is not None and warm:
            injected = self._injector.after_compute(compute)
        self._injected_s = injected
        record = StepRecord(
            self.step_count,
            compute + injected,
            data,
            sync,
            self.batch_size if samples is None else samples,
            self.batch_size,
        )
        self._records.append(record)
        self.last_step = record
        if self._tags:
            self._trained.extend(self.take_tags())
        if self._trained and started - self._committed_at >= self.commit_every_s:
            self.commit_trained()
        self.step_count += 1
        self._data_wait = self._sync_wait = 0.0
        applying = self._apply_due_timed() if self._inbox else 0.0
        self._mark = time.perf_counter()  # pauses and the agent's own work are not the next step's
        # from the clock reads this call makes anyway: its own time, less slowdown and commands
        self.overhead_s += self._mark - started - injected - applying
        return record

    def compute_so_far(self) -> float:
        """This step's compute until now: its time less what was booked as waiting, plus the last
        step's injected slowdown (slept in :meth:`step`, after the step's collectives, so this
        step's is not known yet). What an in-band sizer sends before the step ends."""
        return (
            time.perf_counter() - self._mark - self._data_wait - self._sync_wait + self._injected_s
        )

    def record(self, compute_s: float, samples: int) -> None:
        """One step timed by the caller (a parameter server's applied update); due commands apply
        here."""
        self._records.append(
            StepRecord(self.step_count, compute_s, 0.0, 0.0, samples, self.batch_size)
        )
        self.step_count += 1
        if self._inbox:
            self._apply_due()

    def data_wait(self):
        """Time spent in this context counts as waiting for data, not compute."""
        return self._booked("_data_wait")

    def sync_wait(self, settle: bool = True):
        """Time spent in this context counts as blocked at synchronisation (all-reduce, barrier).

        On CUDA the device's queued work is finished first and booked as
        compute: the collective would otherwise wait for it inside the context
        (``settle=False``: the caller settles the device it knows). A context
        entered inside one of its own kind books nothing more.
        """
        return self._booked("_sync_wait", settle=settle)

    def book_sync_wait(self, seconds: float) -> None:
        """Count ``seconds`` this step spent blocked at synchronisation, timed by the caller (inside
        DDP's backward pass, say, where no context can be entered)."""
        self._sync_wait += seconds

    def waited_whole_step(self) -> None:
        """Book this step so far, less its data wait, as sync wait: a rank with no samples that
        joined the others' step did none of its own work (a framework's forward and backward on
        a placeholder batch included), and a 0-sample step's time booked as compute would make
        the rank look slower per sample."""
        whole = time.perf_counter() - self._mark - self._data_wait
        self._sync_wait = max(self._sync_wait, whole)

    @contextmanager
    def _booked(self, account: str, settle: bool = False) -> Iterator[None]:
        if account in self._booking:  # already timed by the enclosing context
            yield
            return
        if settle:
            settle_device(self.spec.device)
        self._booking.add(account)
        started = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, account, getattr(self, account) + time.perf_counter() - started)
            self._booking.discard(account)

    def iterate(self, iterable: Iterable) -> Iterator:
        """Yield from ``iterable``, booking the time to get each item as data wait.

        Time the iterable books as synchronisation itself (a sharded dataset
        waiting for the others at an epoch's end) is not counted twice.
        Tagged items (from a :class:`ShardedDataset`, one sample or a batch)
        are yielded without their tags, which are kept for the next commit.
        """
        iterator = iter(iterable)
        while True:
            started, synced = time.perf_counter(), self._sync_wait
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self._data_wait += time.perf_counter() - started - (self._sync_wait - synced)
            yield self.untag(item)

    def untag(self, item):
        """The data of a :class:`~antdt.worker.provenance.Tagged` item, its tags kept for the step
        (others as they are)."""
        from antdt.worker.provenance import Tagged

        if isinstance(item, Tagged):
            self._tags.extend(item.tags)
            return item.data
        return item

    @property
    def pending_tags(self) -> tuple:
        """The provenance of the samples iterated since the last step or take (not taken)."""
        return tuple(self._tags)

    def commit_trained(self) -> None:
        """Send the commits of every trained sample now (before a checkpoint, at the end)."""
        if self._trained:
            tags, self._trained = self._trained, []
            self.committer.record(tags, self.step_count)
        self._committed_at = time.perf_counter()

    def take_tags(self) -> list:
        """The provenance of the samples iterated since the last step or take; the caller commits
        them."""
        tags, self._tags = self._tags, []
        return tags

    @property
    def shard_client(self):
        """This process's sharder client as this worker (made on first use; shared by its datasets
        and commits)."""
        if self._shard_client is None:
            from antdt.worker.shard_client import ShardClient

            self._shard_client = ShardClient(
                self.settings, self.spec.job_id, self.spec.worker_id, incarnation=self.incarnation
            )
        return self._shard_client

    @property
    def committer(self):
        """Commits this worker's trained samples (see :mod:`antdt.worker.commits`)."""
        if self._committer is None:
            from antdt.worker.commits import Committer

            self._committer = Committer(self.shard_client, self._revoke)
        return self._committer

    def _revoke(self, grants: set) -> None:
        for dataset in self._datasets:
            dataset.revoked |= grants

    def shards(self, source, dataset_spec, **options):
        """A :class:`ShardedDataset` over ``source`` that pulls shards as this worker."""
        from antdt.worker.dataset import ShardedDataset

        client = self.shard_client
        client.dataset = dataset_spec
        options.setdefault("waiting_for_others", self.sync_wait)
        dataset = ShardedDataset(
            source,
            dataset_spec,
            settings=self.settings,
            job_id=self.spec.job_id,
            worker_id=self.spec.worker_id,
            quota=self.shard_quota,
            client=client,
            **options,
        )
        self.on_shard_quota(lambda quota: setattr(dataset, "quota", quota))
        self._datasets.append(dataset)
        return dataset

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path, model, optimizer, dataset, extra: dict | None = None) -> int:
        """Save model, optimizer, step and the shard-state version together; returns the version.

        Under DDP call it on every rank through
        :func:`antdt.worker.ddp.agreed_checkpoint_version` first, so every
        rank's reports are covered by the version rank 0 stores.
        """
        from antdt.worker.checkpoint import save_checkpoint

        version = dataset.checkpoint_version(self.step_count)
        save_checkpoint(path, model, optimizer, version, self.step_count, extra)
        return version

    def restore_checkpoint(self, path, model, optimizer, dataset):
        """Load a checkpoint and rewind the job's shard state to the version stored with it."""
        from antdt.worker.checkpoint import load_checkpoint

        info = load_checkpoint(path, model, optimizer)
        dataset.rewind(info.shard_version)
        # the steps before the restore go out as they were: step numbers start again below
        self._report()
        self.step_count = info.step
        return info

    # ------------------------------------------------------------ callbacks

    def on_batch_size(self, callback: Callable[[int], None]) -> None:
        """Called (on the training thread) with the new local batch size."""
        self._batch_size_callbacks.append(callback)

    def on_shard_quota(self, callback: Callable[[int], None]) -> None:
        self._quota_callbacks.append(callback)

    def on_restart(self, callback: Callable[[], None]) -> None:
        """Called before the process exits for RESTART or EVICT: save a checkpoint here."""
        self._restart_callbacks.append(callback)

    def on_command(self, name: str, callback: Callable[[MitigationCommand], None]) -> None:
        """Handle CUSTOM commands whose ``custom_action`` is ``name``."""
        self._custom[name] = callback

    def handle(self, action: CommandAction, handler: Callable[[MitigationCommand], None]) -> None:
        """Take ``action``'s commands over: ``handler`` gets each at the next step boundary,
        whatever its effective step, and acknowledges it (:meth:`acknowledge`) once it is in effect.

        For a training loop that must agree with its peers on when to apply
        one (:class:`~antdt.worker.elastic.job.ElasticJob`'s batch sizes).
        """
        self._handlers[action] = handler

    def acknowledge(
        self,
        command: MitigationCommand,
        status: AckStatus,
        reason: str | None = None,
        step: int | None = None,
    ) -> None:
        """Tell the controller what became of ``command`` (for commands a :meth:`handle` handler
        took)."""
        self._ack(command, status, reason, step)

    # ------------------------------------------------------------ commands

    def _on_verdict(self, command: MitigationCommand, verdict: Verdict) -> None:
        """Listener thread: ack what is refused or scheduled, queue what is to be applied."""
        if verdict is not ACCEPT:
            self._ack(command, verdict.status, verdict.reason)
            return
        if command.effective_step is not None and command.effective_step > self.step_count:
            self._ack(
                command,
                AckStatus.SCHEDULED,
                f"at step {command.effective_step}",
                command.effective_step,
            )
        self._inbox.append(command)
        if command.action is CommandAction.RESUME:
            self._resumed.set()

    def _apply_due_timed(self) -> float:
        """Apply the due commands; the seconds it took (a pause, the user's callbacks)."""
        started = time.perf_counter()
        self._apply_due()
        return time.perf_counter() - started

    def _apply_due(self) -> None:
        waiting = deque()
        while self._inbox:
            command = self._inbox.popleft()
            handler = self._handlers.get(command.action)
            if handler is not None:
                handler(command)
            elif command.effective_step is not None and command.effective_step > self.step_count:
                waiting.append(command)
            else:
                self._apply(command)
        self._inbox.extend(waiting)
        if self.state is AgentState.PAUSED:
            self._wait_while_paused()

    def _apply(self, command: MitigationCommand) -> None:
        late = command.effective_step is not None and self.step_count > command.effective_step
        note = f"late by {self.step_count - command.effective_step} steps" if late else None
        try:
            exit_code = self._perform(command)
        except Exception as exc:  # a user callback failed: report it, keep training
            self._ack(
                command, AckStatus.FAILED, f"{type(exc).__name__}: {exc}"[:500], self.step_count
            )
            return
        if exit_code is None:
            self._ack(command, AckStatus.APPLIED, note, self.step_count)
            return
        self._ack(command, AckStatus.APPLIED, command.reason[:500], self.step_count)
        for callback in self._restart_callbacks:
            callback()
        self.exit_reason = f"{command.action.value.lower()}: {command.reason}"[:500]
        raise WorkerExit(exit_code, self.exit_reason)

    def _perform(self, command: MitigationCommand) -> int | None:
        """Carry out one command; an exit code means the process must end."""
        action = command.action
        if action is CommandAction.ADJUST_BATCH_SIZE:
            self.batch_size = command.batch_size
            for callback in self._batch_size_callbacks:
                callback(command.batch_size)
        elif action is CommandAction.SET_SHARD_QUOTA:
            self.shard_quota = command.shard_quota
            for callback in self._quota_callbacks:
                callback(command.shard_quota)
        elif action is CommandAction.PAUSE:
            self.state = AgentState.PAUSED
            # from the PAUSE, however many other commands come while it holds
            self._pause_until = time.monotonic() + self.settings.pause_limit_s
            self._paused_by = command
            self._resumed.clear()
        elif action is CommandAction.RESUME:
            self.state = AgentState.RUNNING
        elif action is CommandAction.RESTART:
            return EXIT_RESTART
        elif action is CommandAction.EVICT:
            return EXIT_EVICTED
        elif action is CommandAction.CUSTOM:
            handler = self._custom.get(command.custom_action)
            if handler is None:
                raise LookupError(
                    f"no handler registered for custom action {command.custom_action!r}"
                )
            handler(command)
        else:
            raise LookupError(f"{action.value} is not an agent action")
        return None

    def _wait_while_paused(self) -> None:
        """PAUSE: hold the training thread at this step boundary until RESUME (or exit).

        Meant for workers that train independently (parameter-server style,
        AntDT-ND). Under synchronous all-reduce a paused rank would hold every
        other rank in its collective; there the controller shrinks the
        worker's batch instead (AntDT-DD).

        A PAUSE with no RESUME within ``pause_limit_s`` (its sender gone, the
        RESUME refused as expired or of an old epoch) ends there: training
        resumes, logged, rather than a worker held for good while its
        heartbeats say it is alive.
        """
        pause, until = self._paused_by, self._pause_until
        while self.state is AgentState.PAUSED and not self._stop.is_set():
            if time.monotonic() >= until:
                log.warning(
                    "PAUSE %s got no RESUME within %g s (ANTDT_PAUSE_LIMIT_S): training resumes",
                    pause.command_id,
                    self.settings.pause_limit_s,
                )
                self.state = AgentState.RUNNING
                return
            self._resumed.wait(min(0.1, max(until - time.monotonic(), 0.0)))
            if self._inbox:
                self._apply_due()
                return

    # ------------------------------------------------------------ reporting

    def _report_loop(self) -> None:
        """Report every ``report_interval_s``, and once as soon as the first step ends.

        The first report with samples is the monitor's warm-up and the controller's opening
        window, left out as holding the set-up's one-off costs. Sent at once, it holds the first
        step alone, and the next one, a report interval later, is already measured: on the
        user-style job (steps of 0.3 s) DD's first split came a step sooner.
        """
        next_report = time.monotonic() + self.spec.report_interval_s
        next_heartbeat = time.monotonic() + self.spec.heartbeat_interval_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, min(next_report, next_heartbeat) - time.monotonic()))
            if self._stop.is_set():
                return
            now = time.monotonic()
            if self._wake.is_set() or now >= next_report:
                self._wake.clear()
                self._report()
                next_report = now + self.spec.report_interval_s
            if now >= next_heartbeat:
                self._lifecycle(LifecycleEvent.HEARTBEAT)
                next_heartbeat += self.spec.heartbeat_interval_s

    def _report(self) -> None:
        """One WorkerMetrics for the steps since the last report (none before the first step:
        nothing to say yet). One at a time: two with the same seq would lose one of them."""
        with self._report_lock:
            self._report_now()

    def _report_now(self) -> None:
        if self._window_start is None and not self._records:
            return
        records = []
        while self._records:
            records.append(self._records.popleft())
        summary = summarize(records)
        self.metrics.totals.add(summary)
        now = utc_now()
        window_start, self._window_start = self._window_start or now, now
        resources = self._sampler.sample() if self._sampler is not None else _zero_resources()
        self._seq += 1
        message = WorkerMetrics(
            job_id=self.spec.job_id,
            worker_id=self.spec.worker_id,
            rank=self.spec.rank,
            node_id=self.spec.node_id,
            seq=self._seq,
            incarnation=self.incarnation,
            window_start=window_start,
            window_end=now,
            **summary.report_fields(),
            local_batch_size=self.batch_size,
            resources=resources,
            role=self.role,
            queue_depth=self.queue_depth,
            world_size=self.spec.world_size,
        )
        self._emitter.emit(self._topics["metrics"], self.spec.job_id, message)

    def _lifecycle(
        self, event: LifecycleEvent, exit_code: int | None = None, reason: str | None = None
    ) -> None:
        message = WorkerLifecycle(
            job_id=self.spec.job_id,
            worker_id=self.spec.worker_id,
            incarnation=self.incarnation,
            event=event,
            timestamp=utc_now(),
            host=self.spec.host,
            node_id=self.spec.node_id,
            pid=os.getpid(),
            rank=self.spec.rank,
            exit_code=exit_code,
            reason=reason,
        )
        self._emitter.emit(self._topics["lifecycle"], self.spec.job_id, message)

    def _ack(
        self,
        command: MitigationCommand,
        status: AckStatus,
        reason: str | None,
        step: int | None = None,
    ) -> None:
        self.metrics.commands.add(command.action, status)
        ack = CommandAck(
            command_id=command.command_id,
            job_id=self.spec.job_id,
            worker_id=self.spec.worker_id,
            status=status,
            reason=reason,
            applied_step=step,
            controller_epoch=command.controller_epoch,
            timestamp=utc_now(),
        )
        self._emitter.emit(self._topics["acks"], self.spec.job_id, ack)

    @property
    def deadlettered(self) -> int:
        """Records on this worker's keys its readers could not use, sent to the dead-letter topic.

        Commands that are no command at all (a refused command is acked and
        counted in ``verifier.rejected`` instead), and shard answers that are
        not assignments for this worker, as read by this process's shard
        clients while they are open (a DataLoader worker process counts its own).
        """
        commands = self._listener.deadlettered if self._listener is not None else 0
        answers = self._shard_client.deadlettered if self._shard_client is not None else 0
        return (
            commands
            + answers
            + sum(
                dataset.deadlettered
                for dataset in self._datasets
                if dataset._client is not self._shard_client
            )
        )

    @property
    def paused(self) -> bool:
        """Whether a PAUSE holds training (until RESUME)."""
        return self.state is AgentState.PAUSED

    @property
    def dropped_events(self) -> int:
        """Events dropped because the bus was unreachable and the queue was full."""
        return self._emitter.dropped


def _make_sampler(device: int | None):
    from antdt.worker.resources import ResourceSampler

    sampler = ResourceSampler(device)
    sampler.sample()  # prime the CPU counters
    return sampler


def _make_injector(settings: Settings, rank: int | None):
    ranks = settings.slowed_ranks
    if not settings.slowdown or (ranks is not None and rank not in ranks):
        return None
    from antdt.worker.injection import SlowdownSpec, StragglerInjector

    injector = StragglerInjector(SlowdownSpec.parse(settings.slowdown), mode=settings.slowdown_mode)
    injector.start()
    return injector


def _zero_resources():
    from antdt.schemas.models import ResourceSnapshot

    return ResourceSnapshot(
        process_cpu_percent=0,
        host_cpu_percent=0,
        cpu_steal_percent=0,
        load_1m=0,
        rss_bytes=0,
        host_memory_percent=0,
        io_read_bytes=0,
        io_write_bytes=0,
        net_sent_bytes=0,
        net_recv_bytes=0,
    )
