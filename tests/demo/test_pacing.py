"""Pacing: a step lasts samples / speed, spent asleep or busy as the episode's cause says."""

from __future__ import annotations

import time

import pytest

from antdt.demo.pacing import Pacer
from antdt.demo.scenario import Episode, Scenario, WorkerSpec


def make(cause: str) -> Scenario:
    worker = WorkerSpec(name="a", episodes=(Episode(start_s=0, end_s=3600, factor=2, cause=cause),))
    return Scenario(name="p", workers=(worker,), dataset_size=10, shard_size=1, base_rate=1000.0)


def paced(cause: str, samples: int = 50) -> tuple[float, float]:
    """One paced step: its wall time and its target."""
    pacer = Pacer(make(cause), 0, time.time())
    wall = time.perf_counter()
    pacer.pace(samples, pacer.now_s())
    return time.perf_counter() - wall, samples / pacer.scenario.speed_at(0, 0)


def test_a_step_lasts_at_least_samples_over_speed():
    elapsed, target = paced("sleep")
    assert target == 0.1  # 50 samples at 1000/s, 2x slower
    assert elapsed >= target


def test_a_cpu_episode_keeps_the_core_busy_and_a_sleep_does_not(monkeypatch):
    """Told apart by what the pacer does, not by the CPU time the machine gave it: a loaded CI
    machine once gave a 100 ms busy pause 4.9 ms of the thread's CPU."""
    slept, busy = [], []
    real_sleep, real_busy = time.sleep, Pacer._busy_until
    monkeypatch.setattr("antdt.demo.pacing.time.sleep", lambda s: slept.append(s) or real_sleep(s))
    monkeypatch.setattr(
        Pacer,
        "_busy_until",
        lambda self, deadline: busy.append(deadline) or real_busy(self, deadline),
    )
    sleep_elapsed, target = paced("sleep")
    assert len(slept) == 1 and 0 < slept[0] <= target and not busy
    busy_elapsed, _ = paced("cpu")
    assert len(busy) == 1 and len(slept) == 1
    assert min(sleep_elapsed, busy_elapsed) >= target


def test_the_pause_fills_what_the_real_work_left_and_an_overrun_adds_nothing(monkeypatch):
    pauses = []
    monkeypatch.setattr("antdt.demo.pacing.time.sleep", pauses.append)
    pacer = Pacer(make("sleep"), 0, time.time() - 60)  # a minute into the run
    # the run's clock stands still at 60 s: the pause is the pacer's arithmetic, not the machine's
    monkeypatch.setattr(pacer, "now_s", lambda: 60.0)
    pacer.pace(50, 60.0 - 0.03)  # 30 ms of real work already done
    assert len(pauses) == 1 and pauses[0] == pytest.approx(0.07)
    pacer.pace(50, pacer.now_s() - 1.0)  # the real work alone took longer than the target
    assert len(pauses) == 1
    pacer.pace(0, pacer.now_s())  # a rank with no samples this step
    assert len(pauses) == 1
