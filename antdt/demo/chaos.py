"""Chaos for a run: kill -9 workers and services on a schedule, let them be restarted, time the
recovery.

What an operator fears in production is a process that dies without a word:
no final report, shards held, offsets uncommitted, a half-written batch, an
update half sent. A chaos run does exactly that with SIGKILL, about every
``worker_every_s`` to a random running worker and once to each service (and
parameter-server shard) at its set time, and the harness restarts the victim
at once, the way an orchestrator's restart policy would (a synchronous group
restarts whole, from its last checkpoint). Every ``mid_step_every``-th worker
kill waits until the victim is in the middle of a step's exchange, a push to
the parameter server or an all-reduce (it reads the worker's phase,
:mod:`antdt.demo.phases`), and kills it there. The run must still finish with
every sample in the model exactly once: the ledger all ones, the log's audit
clean and agreeing with it.

The time lost to a kill is measured from the kill until the victim serves
again: for a worker, its first metrics report after the kill that counts
trained samples (or its exit once the job is over); for a service, its
``/readyz`` answering again (state recovered, topics there); for a
parameter-server shard, serving gradients again (its rollback done).

With ``broker_at_s`` the embedded broker itself is killed and started again,
empty, on the same port: every topic, record, offset and group is gone. The
run has recovered when every unfinished worker has been granted shards by
the sharder through the new bus and has reported training after that grant
(a worker trains on for a while on the shards it already held) and the
monitor serves again; the parts record when the broker answered again,
when the sharder and the controller had re-announced their state, and
when the monitor was back.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from antdt.demo.phases import Phase, read_phase
from antdt.demo.training_preduce import CHECKPOINT as PREDUCE_CHECKPOINT
from antdt.demo.training_sync import CHECKPOINT as SYNC_CHECKPOINT
from antdt.training import TrainingMode

if TYPE_CHECKING:
    from antdt.demo.pool import WorkerPool
    from antdt.demo.services import Services
    from antdt.demo.timeline import Timeline
    from antdt.embedded.broker import EmbeddedBroker

#: How long a mid-step kill waits for its victim to enter the exchange before it gives up on that
#: victim.
MID_STEP_WAIT_S = 5.0
#: What a kill in each mode's exchange interrupts, for the report.
EXCHANGE = {
    TrainingMode.ASYNC: "push",
    TrainingMode.SYNC: "all-reduce",
    TrainingMode.PREDUCE: "group average",
}


@dataclass(frozen=True)
class ChaosSpec:
    """When to kill what: workers about every ``worker_every_s`` (±20 %), at most
    ``worker_kills`` of them (None: no limit), each service once at its time."""

    worker_every_s: float = 4.0
    service_at_s: dict[str, float] = field(
        default_factory=lambda: {"sharder": 11.0, "ps-0": 14.0, "controller": 17.0, "monitor": 20.0}
    )
    seed: int = 0
    broker_at_s: float | None = 8.0
    mid_step_every: int = 2  # every n-th worker kill lands mid-step (0: none)
    #: Kills of a synchronous group restart all of it and lengthen the run, which brings more
    #: kills: a bound makes a run's length (and a CI run's) predictable.
    worker_kills: int | None = None


@dataclass
class Kill:
    """One SIGKILL: what, when (seconds since the start signal), and when the victim served
    again."""

    target: str
    kind: str  # "worker", "service" or "broker"
    at_s: float
    back_s: float | None = None
    # a broker restart: when each part was back (s after the kill)
    parts: dict[str, float] = field(default_factory=dict)
    phase: str | None = None  # a worker killed mid-step: "push" or "all-reduce"
    due_s: float | None = None  # a scheduled kill: when it was due (held back while others recover)

    @property
    def lost_s(self) -> float | None:
        return None if self.back_s is None else self.back_s - self.at_s

    def to_dict(self) -> dict:
        lost = self.lost_s
        return {
            "target": self.target,
            "kind": self.kind,
            "at_s": round(self.at_s, 2),
            "lost_s": None if lost is None else round(lost, 2),
            **({"mid_step": self.phase} if self.phase else {}),
            **({"due_s": round(self.due_s, 2)} if self.due_s is not None else {}),
            **({"parts": {k: round(v, 2) for k, v in self.parts.items()}} if self.parts else {}),
        }


class Chaos:
    """Carries out a :class:`ChaosSpec` from the harness's supervision loop (one :meth:`tick` per
    loop)."""

    def __init__(self, spec: ChaosSpec | None = None, broker: EmbeddedBroker | None = None):
        self.spec = spec or ChaosSpec()
        self.broker = broker
        if self.spec.broker_at_s is not None and broker is None:
            raise ValueError("a broker restart needs the embedded broker")
        self._broker_due = self.spec.broker_at_s
        self.kills: list[Kill] = []
        self._rng = random.Random(self.spec.seed)
        self._worker_kills = 0
        self._next_worker_s = self._interval()
        self._services_due = dict(self.spec.service_at_s)
        # a grouped run: the newest checkpoint's time when the group came back from the last kill
        self._checkpoint_when_back = 0.0

    @property
    def survived(self) -> int:
        """Kills the victim came back from."""
        return sum(kill.back_s is not None for kill in self.kills)

    def count(self, kind: str) -> int:
        return sum(kill.kind == kind for kill in self.kills)

    @property
    def mid_step(self) -> int:
        return sum(kill.phase is not None for kill in self.kills)

    def tick(self, now_s: float, pool: WorkerPool, services: Services, timeline: Timeline) -> None:
        """One look: note who is back, then carry out what is due, one fault at a time.

        A service or the broker is killed only once every earlier service and
        broker kill has recovered, and no worker is killed while the bus is
        being recovered: a sharder killed before it re-published its state
        into a reset bus takes the only copy of that state with it, a double
        fault no system whose log is the bus survives (docs/reliability.md).
        A fault held back this way goes off late, and its kill says when it was due.
        """
        looked = time.monotonic()
        self._note_recoveries(now_s, pool, services, timeline)
        if (
            now_s >= self._next_worker_s
            and not self._recovering("broker")
            and self._kill_a_worker(now_s, pool)
        ):
            self._next_worker_s = now_s + self._interval()
        # the worker kill may have waited for its victim's phase
        now_s += time.monotonic() - looked
        if self._recovering("broker", "service"):
            return
        if self._broker_due is not None and now_s >= self._broker_due:
            kill = Kill("broker", "broker", now_s, due_s=self._broker_due)
            self._broker_due = None
            kill.parts["broker"] = self.broker.restart()
            self.kills.append(kill)
            return
        for name, at_s in list(self._services_due.items()):
            if now_s >= at_s and name in services.processes:
                del self._services_due[name]
                services.kill_and_restart(name)
                self.kills.append(Kill(name, "service", now_s, due_s=at_s))
                return

    def _recovering(self, *kinds: str) -> bool:
        """A kill of one of these kinds whose victim is not back yet."""
        return any(kill.back_s is None and kill.kind in kinds for kill in self.kills)

    def _interval(self) -> float:
        limit = self.spec.worker_kills
        if self.spec.worker_every_s <= 0 or (limit is not None and self._worker_kills >= limit):
            return float("inf")  # no (more) worker kills
        return self.spec.worker_every_s * self._rng.uniform(0.8, 1.2)

    def _kill_a_worker(self, now_s: float, pool: WorkerPool) -> bool:
        """A random running worker; in a synchronous run only once the group is back from the last
        kill.

        (Killing a rank restarts the whole group; killing again before it is
        back would only kill processes still starting up, and killing it
        again before it has checkpointed since would throw away all it did:
        on a loaded machine, kills could then come faster than progress.)
        """
        recovering = {
            kill.target for kill in self.kills if kill.back_s is None and kill.kind == "worker"
        }
        if pool.plan.grouped and (recovering or not self._checkpointed_since_back(pool)):
            return False
        if _group_done(pool):
            return False
        names = {rank: pool.scenario.workers[rank].name for rank in pool.running()}
        candidates = sorted(rank for rank, name in names.items() if name not in recovering)
        if not candidates:
            return False
        rank = self._rng.choice(candidates)
        every = self.spec.mid_step_every
        phase = None
        waited = time.monotonic()
        if every and (self._worker_kills + 1) % every == 0:
            asynchronous = pool.plan.training is TrainingMode.ASYNC
            wanted = Phase.PUSH if asynchronous else Phase.ALLREDUCE
            phase = EXCHANGE[pool.plan.training]
            if not _wait_for_phase(pool, rank, wanted):
                # it never got there (too slow): killed all the same, not counted mid-step
                phase = None
        if rank not in pool.running() or _group_done(pool):
            return False  # it finished meanwhile: nothing left to kill
        self._worker_kills += 1
        pool.kill(rank)
        self.kills.append(
            Kill(names[rank], "worker", now_s + time.monotonic() - waited, phase=phase)
        )
        return True

    def _checkpointed_since_back(self, pool: WorkerPool) -> bool:
        return _newest_checkpoint(pool) > self._checkpoint_when_back

    def _note_recoveries(
        self, now_s: float, pool: WorkerPool, services: Services, timeline: Timeline
    ) -> None:
        finished = {pool.scenario.workers[rank].name for rank in pool.finished}
        for kill in self.kills:
            if kill.back_s is not None:
                continue
            if kill.kind == "service":
                kill.back_s = now_s if _serves(services, kill.target) else None
            elif kill.kind == "broker":
                kill.back_s = self._bus_back(kill, now_s, pool, services, timeline, finished)
            else:
                trained = timeline.trained_after(kill.target, kill.at_s)
                kill.back_s = (
                    trained if trained is not None else (now_s if kill.target in finished else None)
                )
                # the group trains a while before the next
                if kill.back_s is not None and pool.plan.grouped:
                    self._next_worker_s = max(self._next_worker_s, kill.back_s + self._interval())
                    self._checkpoint_when_back = _newest_checkpoint(pool)

    def _bus_back(
        self,
        kill: Kill,
        now_s: float,
        pool: WorkerPool,
        services: Services,
        timeline: Timeline,
        finished: set[str],
    ) -> float | None:
        """When the run is whole again after a broker restart: every unfinished worker granted
        shards and training since.

        On the way: when each service was back on the new bus: the sharder and
        the controller re-announced their state, the monitor restarted in
        place and serves (each one's bus-reset counter, read from its
        /metrics; one killed and started again since counts once ready), and
        each parameter-server shard takes gradients.
        """
        started_since = {k.target for k in self.kills if k.kind == "service" and k.at_s > kill.at_s}
        for name in services.processes:
            if name in kill.parts:
                continue
            if name.startswith("ps-"):
                back = _serves(services, name)
            else:
                back = (
                    name in started_since or services.bus_resets(name) > 0
                ) and services.is_ready(name)
            if back:
                kill.parts[name] = now_s - kill.at_s
        names = [worker.name for worker in pool.scenario.workers if worker.name not in finished]
        grants = [timeline.granted_after(name, kill.at_s) for name in names]
        trained = [
            None if g is None else timeline.trained_after(name, g) for name, g in zip(names, grants)
        ]
        if any(t is None for t in trained) or any(
            name not in kill.parts for name in services.processes
        ):
            return None
        if trained:
            kill.parts["first worker"], kill.parts["workers"] = (
                min(trained) - kill.at_s,
                max(trained) - kill.at_s,
            )
        return kill.at_s + max(kill.parts.values())


def _group_done(pool: WorkerPool) -> bool:
    """A group (synchronous, partial reduce) with a finished rank is done: a kill now would restart
    nothing."""
    return pool.plan.grouped and bool(pool.finished)


def _newest_checkpoint(pool: WorkerPool) -> float:
    """When a grouped run last wrote its all-rank checkpoint (file time; 0.0: never)."""
    paths = (pool.handshake / name for name in (SYNC_CHECKPOINT, PREDUCE_CHECKPOINT))
    return max((path.stat().st_mtime for path in paths if path.exists()), default=0.0)


def _wait_for_phase(
    pool: WorkerPool, rank: int, wanted: Phase, timeout_s: float = MID_STEP_WAIT_S
) -> bool:
    """Poll the worker's phase until it is ``wanted``: True then (the kill follows at once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and rank in pool.running():
        if read_phase(pool.handshake, rank) is wanted:
            return True
        time.sleep(0.0002)
    return False


def _serves(services: Services, name: str) -> bool:
    """A service answers /readyz; a parameter-server shard takes gradients again."""
    if name.startswith("ps-"):
        return services.processes[name].metrics().get("antdt_ps_serving", 0.0) == 1.0
    return services.is_ready(name)
