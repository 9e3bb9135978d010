"""The chaos schedule: one fault at a time, so a run measures the faults the design claims to
survive.

The pool, services, timeline and broker are small stand-ins: the schedule's decisions depend only
on who runs, who is ready and who has trained since when.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from antdt.demo.chaos import Chaos, ChaosSpec
from antdt.demo.faults import Fault, FaultAction, Target
from antdt.demo.hog import CpuHog
from antdt.demo.training_sync import CHECKPOINT as SYNC_CHECKPOINT


@dataclass
class Pool:
    """Two workers (asynchronous unless told), both running."""

    plan: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(grouped=False))
    scenario: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(
            workers=[SimpleNamespace(name="w0"), SimpleNamespace(name="w1")]
        )
    )
    finished: set[int] = field(default_factory=set)
    killed: list[int] = field(default_factory=list)
    handshake: Path = Path("/nonexistent")

    def running(self) -> list[int]:
        return [0, 1]

    def kill(self, rank: int) -> None:
        self.killed.append(rank)


@dataclass
class Services:
    """Services that are ready unless listed as down; a kill takes one down."""

    processes: dict[str, object] = field(
        default_factory=lambda: dict.fromkeys(["sharder", "controller", "monitor"])
    )
    down: set[str] = field(default_factory=set)
    killed: list[str] = field(default_factory=list)

    def kill_and_restart(self, name: str) -> None:
        self.killed.append(name)
        self.down.add(name)

    def is_ready(self, name: str) -> bool:
        return name not in self.down

    def bus_resets(self, name: str) -> float:
        return 1.0


@dataclass
class Timeline:
    """Every worker was granted shards a second before ``back_at`` and trained then (None: not
    yet)."""

    back_at: float | None = None

    def trained_after(self, worker: str, t: float) -> float | None:
        return self.back_at if self.back_at is not None and self.back_at > t else None

    def granted_after(self, worker: str, t: float) -> float | None:
        granted = None if self.back_at is None else self.back_at - 1.0
        return granted if granted is not None and granted > t else None


class Broker:
    def __init__(self):
        self.restarts = 0

    def restart(self) -> float:
        self.restarts += 1
        return 0.05


def chaos(worker_every_s: float = 0.0) -> tuple[Chaos, Broker]:
    broker = Broker()
    spec = ChaosSpec(
        worker_every_s=worker_every_s,
        service_at_s={"sharder": 11.0},
        broker_at_s=8.0,
        mid_step_every=0,
    )
    return Chaos(spec, broker), broker


def test_a_service_due_while_the_bus_recovers_waits_until_every_part_is_back():
    the_chaos, broker = chaos()
    pool, services, timeline = Pool(), Services(), Timeline()
    # a late look: the broker was due at 8, the sharder at 11; only the broker goes
    the_chaos.tick(12.0, pool, services, timeline)
    assert broker.restarts == 1 and services.killed == []
    the_chaos.tick(14.0, pool, services, timeline)  # the workers have not trained since
    assert services.killed == []
    timeline.back_at = 15.0
    the_chaos.tick(16.0, pool, services, timeline)
    assert services.killed == ["sharder"]
    broker_kill, sharder_kill = the_chaos.kills
    assert broker_kill.back_s == pytest.approx(15.0) and broker_kill.to_dict()["due_s"] == 8.0
    assert sharder_kill.at_s >= 16.0 and sharder_kill.to_dict()["due_s"] == 11.0


def test_the_broker_waits_for_a_service_that_is_not_back():
    broker = Broker()
    spec = ChaosSpec(worker_every_s=0, service_at_s={"sharder": 5.0}, broker_at_s=6.0)
    the_chaos = Chaos(spec, broker)
    pool, services, timeline = Pool(), Services(), Timeline(back_at=1.0)
    the_chaos.tick(5.0, pool, services, timeline)
    the_chaos.tick(7.0, pool, services, timeline)
    assert services.killed == ["sharder"] and broker.restarts == 0
    services.down.clear()
    the_chaos.tick(7.5, pool, services, timeline)  # noted back at this look; the broker goes now
    assert broker.restarts == 1 and the_chaos.survived == 1


def test_no_worker_is_killed_while_the_bus_recovers():
    the_chaos, broker = chaos(worker_every_s=1.0)
    pool, services, timeline = Pool(), Services(), Timeline()
    the_chaos.tick(8.0, pool, services, timeline)  # a worker and the broker both due
    assert broker.restarts == 1
    killed_before = list(pool.killed)
    the_chaos.tick(9.5, pool, services, timeline)
    the_chaos.tick(10.5, pool, services, timeline)
    assert pool.killed == killed_before
    timeline.back_at = 11.0
    the_chaos.tick(11.5, pool, services, timeline)  # back: workers are fair game again
    the_chaos.tick(13.0, pool, services, timeline)
    assert len(pool.killed) > len(killed_before)


def test_a_group_is_killed_again_only_after_it_has_checkpointed_since_it_came_back(tmp_path):
    """Otherwise kills could come faster than a loaded machine makes progress."""
    spec = ChaosSpec(worker_every_s=1.0, service_at_s={}, broker_at_s=None, mid_step_every=0)
    the_chaos = Chaos(spec)
    pool = Pool(plan=SimpleNamespace(grouped=True), handshake=tmp_path)
    services, timeline = Services(), Timeline()
    checkpoint = tmp_path / SYNC_CHECKPOINT
    checkpoint.write_bytes(b"first")
    os.utime(checkpoint, (100.0, 100.0))
    the_chaos.tick(2.0, pool, services, timeline)
    assert len(pool.killed) == 1
    timeline.back_at = 4.0
    for now_s in (5.0, 7.0, 9.0):  # back, but no checkpoint since
        the_chaos.tick(now_s, pool, services, timeline)
    assert len(pool.killed) == 1
    os.utime(checkpoint, (200.0, 200.0))
    the_chaos.tick(10.0, pool, services, timeline)
    assert len(pool.killed) == 2


def test_worker_kills_stop_at_the_limit():
    spec = ChaosSpec(
        worker_every_s=1.0, service_at_s={}, broker_at_s=None, mid_step_every=0, worker_kills=3
    )
    the_chaos = Chaos(spec)
    pool, services, timeline = Pool(), Services(), Timeline(back_at=0.5)
    for now_s in range(1, 30):
        timeline.back_at = now_s - 0.5  # each victim is back before the next look
        the_chaos.tick(float(now_s), pool, services, timeline)
    assert len(pool.killed) == 3 and the_chaos.count("worker") == 3


@dataclass
class Process:
    """A victim's process: the signals it was sent, in order."""

    signals: list[int] = field(default_factory=list)
    pid: int = 0

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def poll(self) -> int | None:
        return None


def drawn(*faults: Fault) -> Chaos:
    return Chaos(ChaosSpec(**{**ChaosSpec.drawn(0).__dict__, "faults": faults}))


def test_a_stopped_worker_is_continued_after_its_hold_and_is_back_only_once_it_trains_again():
    stop = Fault(5.0, FaultAction.STOP, Target.WORKER, hold_s=4.0)
    kill = Fault(6.0, FaultAction.KILL, Target.WORKER)
    the_chaos = drawn(stop, kill)
    pool, services, timeline = Pool(), Services(), Timeline()
    pool.processes = {0: Process(), 1: Process()}
    the_chaos.tick(5.0, pool, services, timeline)
    (victim,) = [p for p in pool.processes.values() if p.signals]
    assert victim.signals == [signal.SIGSTOP]
    timeline.back_at = 7.0  # a report from before the stop's end does not count
    the_chaos.tick(7.5, pool, services, timeline)  # the kill is due, but one fault at a time
    assert pool.killed == [] and the_chaos.survived == 0
    the_chaos.tick(9.2, pool, services, timeline)  # the hold is over
    assert victim.signals == [signal.SIGSTOP, signal.SIGCONT]
    timeline.back_at = 10.0
    the_chaos.tick(10.5, pool, services, timeline)
    (stopped, killed) = the_chaos.kills
    assert stopped.back_s == 10.0 and stopped.to_dict()["held_s"] == 4.0
    assert killed.action is FaultAction.KILL and len(pool.killed) == 1


def test_a_stopped_service_is_back_when_it_answers_after_its_sigcont():
    the_chaos = drawn(Fault(3.0, FaultAction.STOP, Target.SERVICE, hold_s=2.0))
    pool, timeline = Pool(), Timeline()
    services = Services(processes={"sharder": SimpleNamespace(process=Process())})
    the_chaos.tick(3.0, pool, services, timeline)
    (stop,) = the_chaos.kills
    assert stop.target == "sharder" and stop.kind == "service" and services.killed == []
    the_chaos.tick(4.0, pool, services, timeline)
    assert stop.back_s is None  # still stopped, however ready it looked before
    the_chaos.tick(5.5, pool, services, timeline)
    assert services.processes["sharder"].process.signals == [signal.SIGSTOP, signal.SIGCONT]
    assert stop.back_s == 5.5 and stop.lost_s == pytest.approx(2.5, abs=0.01)


def test_a_run_that_ends_while_a_victim_is_stopped_continues_it():
    the_chaos = drawn(Fault(1.0, FaultAction.STOP, Target.WORKER, hold_s=60.0))
    pool, services, timeline = Pool(), Services(), Timeline()
    pool.processes = {0: Process(), 1: Process()}
    the_chaos.tick(1.0, pool, services, timeline)
    the_chaos.release_all()
    assert sorted(sum((p.signals for p in pool.processes.values()), [])) == sorted(
        [signal.SIGSTOP, signal.SIGCONT]
    )


def test_a_cpu_hog_pins_its_victim_to_one_core_with_a_busy_loop_and_lets_it_go_after():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        allowed = os.sched_getaffinity(victim.pid)
        hog = CpuHog(victim.pid)
        assert os.sched_getaffinity(victim.pid) == {max(allowed)}
        assert os.sched_getaffinity(hog._burner.pid) == {max(allowed)}
        assert hog._burner.poll() is None  # busy
        hog.stop()
        assert os.sched_getaffinity(victim.pid) == allowed and hog._burner.poll() is not None
    finally:
        victim.kill()
        victim.wait()
