"""Straggler injection: make one worker slow on purpose, for demos, tests and benchmarks.

Mitigation can only be shown, tested and measured against a straggler whose
slowness is known: when it starts, when it ends and how bad it is. A
:class:`SlowdownSpec` says that per worker (``ANTDT_SLOWDOWN`` or
``--slowdown``): ``"3.0"`` is a constant factor, ``"10-40:4.0,60-70:3.0"``
are episodes in seconds since the injector started.

Two modes, because they answer different questions:

``sleep``
    After a step's real compute of ``c`` seconds the worker sleeps
    ``(factor - 1) * c``, so the step takes ``factor`` times as long. Exact
    and deterministic, so the monitor's and controller's decisions can be
    checked against the known factor; but the resource snapshot shows nothing
    unusual (the cause reads as UNKNOWN).
``cpu``
    During an episode, ``competitors`` processes (one per core by default)
    spin on the CPU beside the worker, so the slowdown is real contention:
    the step times grow by however much the scheduler takes away, and the
    resource snapshot shows the busy host, as a noisy neighbour would. The
    factor only marks the episode; how slow the worker gets depends on the
    workload and the cores.

The competitors are plain ``python -c`` child processes rather than
``multiprocessing`` ones: ``fork`` in a process with Kafka and torch threads
is unsafe (and deprecated since Python 3.12), while ``spawn`` and
``forkserver`` re-import the training script, which re-runs it when it has no
``if __name__ == "__main__"`` guard. They are never left behind: they stop at
the end of each episode, on :meth:`StragglerInjector.close` (also from the
context manager and at interpreter exit), and each one exits by itself within
0.1 s once its parent is gone, even when the parent was killed with SIGKILL.
"""

from __future__ import annotations

import atexit
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from antdt.errors import AntdtError

MODES = ("sleep", "cpu")
SLOWDOWN_VAR = "ANTDT_SLOWDOWN"
MODE_VAR = "ANTDT_SLOWDOWN_MODE"

#: A competitor: burn one core until the parent whose pid is argv[1] is gone.
#: It checks every 0.1 s, so an orphan (parent killed) stops almost at once.
_SPIN = """\
import os, sys, time
parent = int(sys.argv[1])
while os.getppid() == parent:
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:
        pass
"""


class InjectionSpecError(AntdtError, ValueError):
    """A slowdown spec or mode is malformed; the message says what and where, on one line."""


# ---------------------------------------------------------------- spec


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InjectionSpecError(
            f"bad slowdown spec {spec!r}: {what} {text.strip()!r} is not a number"
        ) from None
    if not math.isfinite(value):
        raise InjectionSpecError(
            f"bad slowdown spec {spec!r}: {what} {text.strip()!r} is not finite"
        )
    return value


def _factor(text: str, spec: str) -> float:
    factor = _number(text, "factor", spec)
    if factor < 1:
        raise InjectionSpecError(
            f"bad slowdown spec {spec!r}: factor {factor:g} is below 1 (1 means no slowdown)"
        )
    return factor


@dataclass(frozen=True)
class SlowPeriod:
    """A slow period: ``start_s <= elapsed < end_s`` runs ``factor`` times slower."""

    start_s: float
    end_s: float
    factor: float

    def covers(self, elapsed_s: float) -> bool:
        return self.start_s <= elapsed_s < self.end_s

    def __str__(self) -> str:
        return f"{self.start_s:g}-{self.end_s:g}:{self.factor:g}"


@dataclass(frozen=True)
class SlowdownSpec:
    """How much slower a worker runs, and when: a constant factor, or episodes.

    Exactly one of ``constant`` and ``episodes`` is set; episodes are sorted
    and do not overlap. Outside every episode the factor is 1.
    """

    constant: float | None = None
    episodes: tuple[SlowPeriod, ...] = ()

    @classmethod
    def parse(cls, text: str) -> SlowdownSpec:
        """``"3.0"`` or ``"10-40:4.0,60-70:3.0"``; raises :class:`InjectionSpecError` naming the
        problem."""
        spec = text.strip()
        if not spec:
            raise InjectionSpecError(
                "bad slowdown spec '': empty (give a factor like 3.0 or episodes like 10-40:4.0)"
            )
        if ":" not in spec:
            return cls(constant=_factor(spec, text))
        episodes = []
        for item in spec.split(","):
            item = item.strip()
            window, colon, factor = item.partition(":")
            start, dash, end = window.partition("-")
            if not item or not colon or not dash or ":" in factor or "-" in end:
                raise InjectionSpecError(
                    f"bad slowdown spec {text!r}: episode {item!r} is not start-end:factor"
                )
            episode = SlowPeriod(
                _number(start, "start", text), _number(end, "end", text), _factor(factor, text)
            )
            if episode.start_s < 0 or episode.end_s <= episode.start_s:
                raise InjectionSpecError(
                    f"bad slowdown spec {text!r}: episode {item!r} needs 0 <= start < end"
                )
            episodes.append(episode)
        episodes.sort(key=lambda e: e.start_s)
        for before, after in zip(episodes, episodes[1:]):
            if after.start_s < before.end_s:
                raise InjectionSpecError(
                    f"bad slowdown spec {text!r}: episodes {before} and {after} overlap"
                )
        return cls(episodes=tuple(episodes))

    def factor_at(self, elapsed_s: float) -> float:
        """The factor ``elapsed_s`` seconds after the injector started."""
        if self.constant is not None:
            return self.constant
        for episode in self.episodes:
            if episode.covers(elapsed_s):
                return episode.factor
        return 1.0

    def next_change_after(self, elapsed_s: float) -> float | None:
        """The next episode boundary after ``elapsed_s``, or None when nothing changes any more."""
        boundaries = (b for e in self.episodes for b in (e.start_s, e.end_s) if b > elapsed_s)
        return min(boundaries, default=None)

    def __str__(self) -> str:
        if self.constant is not None:
            return f"{self.constant:g}"
        return ",".join(str(e) for e in self.episodes)


def parse_slowdown(text: str) -> SlowdownSpec:
    """Parse a ``--slowdown`` / ``ANTDT_SLOWDOWN`` value (see :meth:`SlowdownSpec.parse`)."""
    return SlowdownSpec.parse(text)


def parse_mode(text: str) -> str:
    """``sleep`` or ``cpu`` (case-insensitive); raises :class:`InjectionSpecError` otherwise."""
    mode = text.strip().lower()
    if mode not in MODES:
        raise InjectionSpecError(f"unknown slowdown mode {text!r}: use sleep or cpu")
    return mode


# ---------------------------------------------------------------- injector


class StragglerInjector:
    """Slows this worker down as its :class:`SlowdownSpec` says.

    The episode clock starts at :meth:`start` (or at the first
    :meth:`factor_now` / :meth:`after_compute`, whichever comes first). The
    training loop calls :meth:`after_compute` after each step's compute; in
    cpu mode a daemon thread starts and stops the competitors at the episode
    boundaries. With ``spec=None`` the injector does nothing, so callers need
    no special case for "no injection".
    """

    def __init__(
        self,
        spec: SlowdownSpec | None,
        mode: str = "sleep",
        clock: Callable[[], float] = time.monotonic,
        *,
        sleep: Callable[[float], None] = time.sleep,
        competitors: int | None = None,
        poll_s: float = 0.05,
    ):
        """``clock`` and ``sleep`` are injectable for tests; ``competitors``: cpu mode's process
        count (default: one per core)."""
        self.spec = spec
        self.mode = parse_mode(mode)
        self.competitors = competitors if competitors is not None else (os.cpu_count() or 1)
        if self.competitors < 1:
            raise InjectionSpecError(f"competitors must be at least 1 (got {self.competitors})")
        self._clock, self._sleep, self._poll_s = clock, sleep, poll_s
        self._t0: float | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._processes: list[subprocess.Popen] = []
        self._closed = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **kwargs) -> StragglerInjector:
        """From ``ANTDT_SLOWDOWN`` (unset or empty: no injection) and ``ANTDT_SLOWDOWN_MODE``
        (default sleep).

        Not started; errors name the variable. ``kwargs`` go to the constructor.
        """
        text = environ.get(SLOWDOWN_VAR, "").strip()
        try:
            spec = parse_slowdown(text) if text else None
        except InjectionSpecError as exc:
            raise InjectionSpecError(f"{SLOWDOWN_VAR}: {exc}") from None
        try:
            mode = parse_mode(environ.get(MODE_VAR, "").strip() or "sleep")
        except InjectionSpecError as exc:
            raise InjectionSpecError(f"{MODE_VAR}: {exc}") from None
        return cls(spec, mode, **kwargs)

    def __repr__(self) -> str:
        return (
            f"StragglerInjector(spec={str(self.spec) if self.spec else None!r}, mode={self.mode!r})"
        )

    # ------------------------------------------------------------ time and factor

    def elapsed(self) -> float:
        """Seconds since the injector started (starting its clock now if it had not)."""
        now = self._clock()
        with self._lock:
            if self._t0 is None:
                self._t0 = now
            return now - self._t0

    def factor_now(self) -> float:
        """The slowdown factor at this moment (1.0: none)."""
        if self.spec is None:
            return 1.0
        return self.spec.factor_at(self.elapsed())

    def after_compute(self, compute_s: float) -> float:
        """Call after a step's compute of ``compute_s`` seconds; returns the seconds injected.

        sleep mode sleeps ``(factor - 1) * compute_s``; cpu mode never sleeps
        (its competitors already slowed the compute down).
        """
        if self.mode != "sleep" or self.spec is None:
            return 0.0
        extra = (self.factor_now() - 1.0) * max(0.0, compute_s)
        if extra > 0:
            self._sleep(extra)
            return extra
        return 0.0

    # ------------------------------------------------------------ cpu competitors

    @property
    def competitor_pids(self) -> list[int]:
        """Pids of the competitor processes running now (empty outside cpu episodes)."""
        with self._lock:
            return [p.pid for p in self._processes]

    def update(self) -> bool:
        """Start or stop the competitors for the current factor; True while they run.

        The cpu-mode thread calls this; tests with a fake clock call it directly.
        """
        with self._lock:
            if self.mode != "cpu" or self.spec is None or self._closed:
                return False
            wanted = self.factor_now() > 1.0
            if wanted and not self._processes:
                self._start_competitors()
            elif not wanted and self._processes:
                self._stop_competitors()
            return bool(self._processes)

    def _start_competitors(self) -> None:
        if not sys.executable:
            raise AntdtError("cpu slowdown needs sys.executable to start its competitor processes")
        command = [sys.executable, "-I", "-S", "-c", _SPIN, str(os.getpid())]
        try:
            for _ in range(self.competitors):
                self._processes.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        except BaseException:
            self._stop_competitors()
            raise

    def _stop_competitors(self) -> None:
        processes, self._processes = self._processes, []
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _run(self) -> None:
        """The cpu-mode thread: follow the episode boundaries until closed or nothing changes any
        more."""
        while not self._stop.is_set():
            running = self.update()
            elapsed = self.elapsed()
            change = self.spec.next_change_after(elapsed) if self.spec else None
            if change is None and running == (self.factor_now() > 1.0):
                return  # constant factor or past the last episode: close() stops what runs
            wait = self._poll_s if change is None else min(self._poll_s, max(0.0, change - elapsed))
            self._stop.wait(wait)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> StragglerInjector:
        """Start the episode clock and, in cpu mode, the thread that runs the competitors.
        Idempotent."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the straggler injector is closed")
            self.elapsed()
            if self.mode == "cpu" and self.spec is not None and self._thread is None:
                atexit.register(self.close)
                self.update()
                self._thread = threading.Thread(
                    target=self._run, name="antdt-straggler-injector", daemon=True
                )
                self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread and terminate and reap every competitor. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        with self._lock:
            self._closed = True
            self._stop_competitors()
        atexit.unregister(self.close)

    def __enter__(self) -> StragglerInjector:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
