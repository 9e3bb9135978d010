"""Chaos for a run: kill -9, stop and starve workers and services on a schedule, let them be
restarted, time the recovery.

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

The time lost to a fault is measured from the fault until the victim serves
again: for a worker, its first metrics report after the kill (or after its
SIGCONT, or the hog's end) that counts trained samples (or its exit once the
job is over); for a service, its ``/readyz`` answering again (state
recovered, topics there); for a parameter-server shard, serving gradients
again (its rollback done).

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
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from antdt.demo.faults import Fault, FaultAction, ScheduleShape, Target, draw_schedule
from antdt.demo.hog import CpuHog
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
#: How long a finished run waits for the victims of its last faults to serve again.
SETTLE_S = 60.0
#: What a kill in each mode's exchange interrupts, for the report.
EXCHANGE = {
    TrainingMode.ASYNC: "push",
    TrainingMode.SYNC: "all-reduce",
    TrainingMode.PREDUCE: "group average",
}


@dataclass(frozen=True)
class ChaosSpec:
    """When to do what: kill workers about every ``worker_every_s`` (±20 %), at most
    ``worker_kills`` of them (None: no limit), each service once at its time, the broker at its
    time, and the ``faults`` of a drawn schedule, one at a time."""

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
    faults: tuple[Fault, ...] = ()

    @classmethod
    def drawn(cls, seed: int, shape: ScheduleShape | None = None) -> ChaosSpec:
        """Only the faults seed ``seed`` draws (:func:`antdt.demo.faults.draw_schedule`)."""
        return cls(
            worker_every_s=0.0,
            service_at_s={},
            seed=seed,
            broker_at_s=None,
            mid_step_every=0,
            faults=draw_schedule(seed, shape),
        )

    def scheduled(self) -> list[Fault]:
        """Every fault due at a time (the services', the broker's, the drawn ones), in order."""
        fixed = [
            Fault(at_s, FaultAction.KILL, Target.SERVICE, name)
            for name, at_s in self.service_at_s.items()
        ]
        if self.broker_at_s is not None:
            fixed.append(Fault(self.broker_at_s, FaultAction.RESTART, Target.BROKER))
        return sorted([*fixed, *self.faults], key=lambda f: (f.at_s, f.target is not Target.BROKER))


@dataclass
class Injection:
    """One fault as injected: what, when (seconds since the start signal), and when the victim
    served again."""

    target: str
    kind: str  # "worker", "service" or "broker"
    at_s: float
    back_s: float | None = None
    # a broker restart: when each part was back (s after the kill)
    parts: dict[str, float] = field(default_factory=dict)
    phase: str | None = None  # a worker hit mid-step: "push" or "all-reduce"
    #: a scheduled fault: when it was due (it waits while an earlier one recovers)
    due_s: float | None = None
    action: FaultAction = FaultAction.KILL
    hold_s: float = 0.0  # a stop or a hog: how long
    scheduled: bool = False  # from the schedule (one at a time), not a periodic worker kill
    #: a stop or a hog still on: what ends it (SIGCONT, the hog's stop)
    release: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    released_s: float | None = None

    @property
    def lost_s(self) -> float | None:
        return None if self.back_s is None else self.back_s - self.at_s

    @property
    def label(self) -> str:
        return f"{self.action.value} {self.kind}"

    def to_dict(self) -> dict:
        lost = self.lost_s
        return {
            "target": self.target,
            "kind": self.kind,
            "action": self.action.value,
            "at_s": round(self.at_s, 2),
            "lost_s": None if lost is None else round(lost, 2),
            **({"held_s": self.hold_s} if self.hold_s else {}),
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
        self._pending = self.spec.scheduled()
        if broker is None and any(f.target is Target.BROKER for f in self._pending):
            raise ValueError("a broker restart needs the embedded broker")
        self.kills: list[Injection] = []
        self._rng = random.Random(self.spec.seed)
        self._worker_kills = 0
        self._next_worker_s = self._interval()
        # a grouped run: the newest checkpoint's time when the group came back from the last fault
        self._checkpoint_when_back = 0.0

    @property
    def survived(self) -> int:
        """Faults the victim came back from."""
        return sum(kill.back_s is not None for kill in self.kills)

    def count(self, kind: str, action: FaultAction = FaultAction.KILL) -> int:
        return sum(kill.kind == kind and kill.action is action for kill in self.kills)

    @property
    def mid_step(self) -> int:
        return sum(kill.phase is not None for kill in self.kills)

    def tick(self, now_s: float, pool: WorkerPool, services: Services, timeline: Timeline) -> None:
        """One look: end the stops and hogs that are due, note who is back, then carry out what is
        due, one fault at a time.

        A scheduled fault (a service's, the broker's, a drawn one) goes off
        only once every earlier scheduled fault has recovered, and no periodic
        worker kill comes while the bus is being recovered: a sharder killed
        before it re-published its state into a reset bus takes the only copy
        of that state with it, a double fault no system whose log is the bus
        survives (docs/reliability.md). A fault held back this way goes off
        late, and its record says when it was due.
        """
        looked = time.monotonic()
        self._release_due(now_s)
        self._note_recoveries(now_s, pool, services, timeline)
        if (
            now_s >= self._next_worker_s
            and not self._recovering(kinds=("broker",))
            and self._fault_a_worker(now_s, pool, FaultAction.KILL)
        ):
            self._next_worker_s = now_s + self._interval()
        # the worker kill may have waited for its victim's phase
        now_s += time.monotonic() - looked
        if self._recovering(scheduled=True) or not self._pending:
            return
        fault = self._pending[0]
        if now_s >= fault.at_s and self._inject(fault, now_s, pool, services):
            self._pending.pop(0)

    def release_all(self) -> None:
        """End every stop and hog still on (the run is over, or failed)."""
        for kill in self.kills:
            self._release(kill, kill.at_s + kill.hold_s)

    def settle(
        self,
        clock: Callable[[], float],
        pool: WorkerPool,
        services: Services,
        timeline: Timeline,
        bound_s: float = SETTLE_S,
    ) -> None:
        """The job is done: end what is still held and wait (at most ``bound_s``) for the last
        victims to serve again, so a fault near the end is judged like any other."""
        self.release_all()
        deadline = time.monotonic() + bound_s
        while True:
            self._note_recoveries(clock(), pool, services, timeline)
            if self.survived == len(self.kills) or time.monotonic() > deadline:
                return
            time.sleep(0.25)

    def _recovering(self, kinds: tuple[str, ...] = (), scheduled: bool = False) -> bool:
        """A fault of one of these kinds (or a scheduled one) whose victim is not back yet."""
        return any(
            kill.back_s is None and (kill.kind in kinds or (scheduled and kill.scheduled))
            for kill in self.kills
        )

    def _interval(self) -> float:
        limit = self.spec.worker_kills
        if self.spec.worker_every_s <= 0 or (limit is not None and self._worker_kills >= limit):
            return float("inf")  # no (more) worker kills
        return self.spec.worker_every_s * self._rng.uniform(0.8, 1.2)

    def _inject(self, fault: Fault, now_s: float, pool: WorkerPool, services: Services) -> bool:
        """Carry out one scheduled fault now: True if it went off (or never can: a service the run
        does not have)."""
        if fault.target is Target.WORKER:
            return self._fault_a_worker(now_s, pool, fault.action, fault)
        if pool.finished:
            return False  # the job is ending: a service hit now would not be seen back
        if fault.target is Target.BROKER:
            kill = Injection(
                "broker", "broker", now_s, due_s=fault.at_s, action=fault.action, scheduled=True
            )
            kill.parts["broker"] = self.broker.restart()
            self.kills.append(kill)
            return True
        name = fault.name or self._rng.choice(sorted(services.processes))
        if name not in services.processes:
            return True
        kill = Injection(
            name, "service", now_s, due_s=fault.at_s, action=fault.action, scheduled=True
        )
        if fault.action is FaultAction.STOP:
            kill.hold_s = fault.hold_s
            kill.release = _stop(services.processes[name].process)
        else:
            services.kill_and_restart(name)
        self.kills.append(kill)
        return True

    def _fault_a_worker(
        self, now_s: float, pool: WorkerPool, action: FaultAction, fault: Fault | None = None
    ) -> bool:
        """A random running worker; in a synchronous run only once the group is back from the last
        fault and has checkpointed since.

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
        phase = None
        waited = time.monotonic()
        if self._mid_step(fault):
            asynchronous = pool.plan.training is TrainingMode.ASYNC
            wanted = Phase.PUSH if asynchronous else Phase.ALLREDUCE
            phase = EXCHANGE[pool.plan.training]
            if not _wait_for_phase(pool, rank, wanted):
                # it never got there (too slow): hit all the same, not counted mid-step
                phase = None
        if rank not in pool.running() or _group_done(pool):
            return False  # it finished meanwhile: nothing left to hit
        kill = Injection(
            names[rank],
            "worker",
            now_s + time.monotonic() - waited,
            phase=phase,
            action=action,
            due_s=None if fault is None else fault.at_s,
            scheduled=fault is not None,
        )
        if action is FaultAction.KILL:
            self._worker_kills += 1
            pool.kill(rank)
        else:
            kill.hold_s = fault.hold_s
            process = pool.processes[rank]
            stop = action is FaultAction.STOP
            kill.release = _stop(process) if stop else CpuHog(process.pid).stop
        # the fault's time is once it is in (the victim dead or stopped): a report whose window
        # ended while the signal was on its way is not the victim back (one such kill counted
        # 0.0 s lost)
        kill.at_s = now_s + time.monotonic() - waited
        self.kills.append(kill)
        return True

    def _mid_step(self, fault: Fault | None) -> bool:
        """Whether this worker fault waits for its victim's exchange: a drawn one says; every n-th
        periodic kill does."""
        if fault is not None:
            return fault.mid_step
        every = self.spec.mid_step_every
        return bool(every) and (self._worker_kills + 1) % every == 0

    def _release_due(self, now_s: float) -> None:
        for kill in self.kills:
            if kill.release is not None and now_s >= kill.at_s + kill.hold_s:
                self._release(kill, now_s)

    @staticmethod
    def _release(kill: Injection, now_s: float) -> None:
        if kill.release is not None:
            kill.release()
            kill.release, kill.released_s = None, now_s

    def _checkpointed_since_back(self, pool: WorkerPool) -> bool:
        return _newest_checkpoint(pool) > self._checkpoint_when_back

    def _note_recoveries(
        self, now_s: float, pool: WorkerPool, services: Services, timeline: Timeline
    ) -> None:
        """Who is back: a stop or a hog counts from its end (a victim still held is not back)."""
        finished = {pool.scenario.workers[rank].name for rank in pool.finished}
        for kill in self.kills:
            if kill.back_s is not None or kill.release is not None:
                continue
            since = kill.at_s if kill.released_s is None else kill.released_s
            if kill.kind == "service":
                kill.back_s = now_s if _serves(services, kill.target) else None
            elif kill.kind == "broker":
                kill.back_s = self._bus_back(kill, now_s, pool, services, timeline, finished)
            else:
                trained = timeline.trained_after(kill.target, since)
                kill.back_s = (
                    trained if trained is not None else (now_s if kill.target in finished else None)
                )
                # the group trains a while before the next
                if kill.back_s is not None and pool.plan.grouped:
                    self._next_worker_s = max(self._next_worker_s, kill.back_s + self._interval())
                    self._checkpoint_when_back = _newest_checkpoint(pool)

    def _bus_back(
        self,
        kill: Injection,
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


def _stop(process) -> Callable[[], None]:
    """SIGSTOP ``process`` now; what is returned sends the SIGCONT (a no-op once it is gone)."""
    process.send_signal(signal.SIGSTOP)

    def resume() -> None:
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass

    return resume
