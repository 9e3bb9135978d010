"""A CPU hog on one rank: a busy process pinned to the same core as every thread of the victim.

Another tenant's job on a shared node, a noisy neighbour, a throttled core:
the victim keeps running and keeps answering, it just gets about half a core.
Pinning both to one core makes that real on any machine, whatever the other
cores do; stopping the hog gives the victim its old affinity back (threads it
started meanwhile included).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _pin(pid: int, cpus: set[int]) -> None:
    """Set the affinity of every thread of ``pid`` (a thread that has just ended is skipped)."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            continue


class CpuHog:
    """Shares one core between ``pid`` and a busy loop until :meth:`stop`."""

    def __init__(self, pid: int):
        self.pid = pid
        self._allowed = os.sched_getaffinity(pid)
        self._core = max(self._allowed)
        self._burner = subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.sched_setaffinity(self._burner.pid, {self._core})
        _pin(pid, {self._core})

    def stop(self) -> None:
        """End the busy loop; the victim (if still alive) may run anywhere it could before."""
        if self._burner.poll() is None:
            self._burner.kill()
        self._burner.wait()
        if Path(f"/proc/{self.pid}").exists():
            _pin(self.pid, self._allowed)
