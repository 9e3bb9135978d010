"""Straggler injection: spec parsing, the factor over time, sleep and cpu modes, no orphans."""

from __future__ import annotations

import psutil
import pytest

from antdt.errors import AntdtError
from antdt.worker.injection import (
    InjectionSpecError,
    SlowdownSpec,
    SlowPeriod,
    StragglerInjector,
    parse_slowdown,
)


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeSleep:
    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


# ---------------------------------------------------------------- parsing


def test_constant_spec():
    spec = parse_slowdown(" 3.0 ")
    assert spec == SlowdownSpec(constant=3.0)
    assert spec.factor_at(0) == spec.factor_at(1e6) == 3.0
    assert str(spec) == "3"


def test_episode_spec_is_sorted():
    spec = parse_slowdown("60-70:3.0, 10-40:4")
    assert spec.episodes == (SlowPeriod(10, 40, 4.0), SlowPeriod(60, 70, 3.0))
    assert str(spec) == "10-40:4,60-70:3"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "empty"),
        ("fast", "factor 'fast' is not a number"),
        ("0.5", "below 1"),
        ("inf", "not finite"),
        ("10-40", "not a number"),
        ("10-40:", "factor '' is not a number"),
        ("10:4", "not start-end:factor"),
        ("10-20-30:2", "not start-end:factor"),
        ("10-40:4:5", "not start-end:factor"),
        ("10-40:4,", "episode '' is not start-end:factor"),
        ("40-10:2", "0 <= start < end"),
        ("5-5:2", "0 <= start < end"),
        ("-5-10:2", "not start-end:factor"),
        ("a-10:2", "start 'a' is not a number"),
        ("10-40:0.9", "below 1"),
        ("10-40:2,30-50:3", "overlap"),
    ],
)
def test_bad_specs_raise_one_line_errors(text, complaint):
    with pytest.raises(InjectionSpecError) as raised:
        parse_slowdown(text)
    message = str(raised.value)
    assert complaint in message
    assert "\n" not in message
    assert isinstance(raised.value, AntdtError) and isinstance(raised.value, ValueError)


def test_bad_mode():
    with pytest.raises(InjectionSpecError, match="unknown slowdown mode 'gpu'"):
        StragglerInjector(None, mode="gpu")


# ---------------------------------------------------------------- factor over time


def test_factor_follows_episodes_on_the_injector_clock():
    clock = FakeClock()
    injector = StragglerInjector(parse_slowdown("10-40:4.0,60-70:3.0"), clock=clock).start()
    expected = {
        0: 1.0,
        9.99: 1.0,
        10: 4.0,
        39.9: 4.0,
        40: 1.0,
        59: 1.0,
        60: 3.0,
        69.9: 3.0,
        70: 1.0,
        500: 1.0,
    }
    for elapsed, factor in expected.items():
        clock.now = 1000.0 + elapsed
        assert injector.factor_now() == factor, elapsed
    injector.close()


def test_clock_starts_at_first_use_without_start():
    clock = FakeClock()
    injector = StragglerInjector(parse_slowdown("0-5:2"), clock=clock)
    clock.now += 100  # nothing has used the injector yet
    assert injector.factor_now() == 2.0
    clock.now += 5
    assert injector.factor_now() == 1.0


def test_no_spec_is_inert():
    sleep = FakeSleep()
    injector = StragglerInjector(None, sleep=sleep)
    assert injector.factor_now() == 1.0
    assert injector.after_compute(1.0) == 0.0
    assert sleep.calls == []


# ---------------------------------------------------------------- sleep mode


def test_sleep_mode_injects_factor_minus_one_times_compute():
    clock, sleep = FakeClock(), FakeSleep()
    injector = StragglerInjector(parse_slowdown("10-20:3.0"), clock=clock, sleep=sleep).start()
    assert injector.after_compute(0.2) == 0.0  # before the episode
    clock.now += 10
    assert injector.after_compute(0.2) == pytest.approx(0.4)
    assert injector.after_compute(-1.0) == 0.0  # nonsense compute time injects nothing
    clock.now += 10
    assert injector.after_compute(0.2) == 0.0  # after it
    assert sleep.calls == [pytest.approx(0.4)]


def test_constant_sleep_mode():
    sleep = FakeSleep()
    with StragglerInjector(parse_slowdown("2.5"), sleep=sleep) as injector:
        assert injector.after_compute(0.1) == pytest.approx(0.15)
    assert sleep.calls == [pytest.approx(0.15)]


# ---------------------------------------------------------------- from_env


def test_from_env():
    injector = StragglerInjector.from_env(
        {"ANTDT_SLOWDOWN": "10-40:4", "ANTDT_SLOWDOWN_MODE": "CPU"}
    )
    assert injector.mode == "cpu"
    assert injector.spec == SlowdownSpec(episodes=(SlowPeriod(10, 40, 4.0),))
    assert StragglerInjector.from_env({}).spec is None
    assert StragglerInjector.from_env({"ANTDT_SLOWDOWN": "  "}).spec is None
    assert StragglerInjector.from_env({"ANTDT_SLOWDOWN": "2"}).mode == "sleep"


def test_from_env_errors_name_the_variable():
    with pytest.raises(InjectionSpecError, match=r"^ANTDT_SLOWDOWN: bad slowdown spec '10-x:2'"):
        StragglerInjector.from_env({"ANTDT_SLOWDOWN": "10-x:2"})
    with pytest.raises(
        InjectionSpecError, match=r"^ANTDT_SLOWDOWN_MODE: unknown slowdown mode 'gpu'"
    ):
        StragglerInjector.from_env({"ANTDT_SLOWDOWN": "2", "ANTDT_SLOWDOWN_MODE": "gpu"})


# ---------------------------------------------------------------- cpu mode (real processes)


def _children() -> set[int]:
    return {
        child.pid
        for child in psutil.Process().children(recursive=True)
        if child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    }


def test_cpu_mode_runs_competitors_only_during_the_episode():
    clock, sleep = FakeClock(), FakeSleep()
    injector = StragglerInjector(
        parse_slowdown("10-20:2"), mode="cpu", clock=clock, sleep=sleep, competitors=2
    )
    with injector:
        assert injector.competitor_pids == []
        clock.now += 10
        assert injector.update() is True
        pids = set(injector.competitor_pids)
        assert len(pids) == 2 and pids <= _children()
        assert injector.after_compute(1.0) == 0.0 and sleep.calls == []  # cpu mode never sleeps
        clock.now += 10
        assert injector.update() is False
        assert injector.competitor_pids == []
        assert not pids & _children()
        assert not any(
            psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            for pid in pids
        )


def test_close_stops_competitors_mid_episode():
    # constant: from the start
    injector = StragglerInjector(parse_slowdown("4"), mode="cpu", competitors=2).start()
    pids = set(injector.competitor_pids)
    assert len(pids) == 2 and pids <= _children()
    injector.close()
    injector.close()  # idempotent
    assert injector.competitor_pids == []
    assert not pids & _children()
    assert injector.update() is False  # closed: never restarts
    with pytest.raises(RuntimeError):
        injector.start()


def test_competitors_exit_by_themselves_when_orphaned():
    """A competitor whose parent died without close() (kill -9) stops on its own."""
    import subprocess
    import sys
    import textwrap

    # A short-lived parent starts a competitor and exits without closing; the orphan must follow.
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import os
            from antdt.worker.injection import parse_slowdown, StragglerInjector
            injector = StragglerInjector(parse_slowdown("9"), mode="cpu", competitors=1).start()
            print(injector.competitor_pids[0], flush=True)
            os._exit(0)  # no atexit, no close(): as if killed
        """),
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    orphan = int(parent.stdout.strip())
    try:
        psutil.Process(orphan).wait(timeout=5)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE


def test_cpu_mode_thread_ends_the_episode_on_the_real_clock():
    import time

    with StragglerInjector(parse_slowdown("0-0.3:2"), mode="cpu", competitors=1) as injector:
        pids = set(injector.competitor_pids)
        assert len(pids) == 1  # started with the injector: the episode starts at 0
        deadline = time.monotonic() + 5.0
        while injector.competitor_pids and time.monotonic() < deadline:
            time.sleep(0.02)
        assert injector.competitor_pids == []  # the thread stopped them, not close()
        assert not pids & _children()
