"""Starting demo worker processes from a fork server that has torch imported already.

Every worker (and parameter-server shard) is a process of its own, as on a real cluster. Importing
torch takes a couple of CPU-seconds, and a synchronous group that restarts after a failure starts
all its ranks at once: on a small machine eight imports in parallel cost ten seconds that say
nothing about antdt. A fork server (:mod:`multiprocessing`'s ``forkserver``, which imports torch
once) forks each worker instead; the child is a fresh process in every other respect: no Kafka
client, thread or CUDA context comes with it, its environment is the one given, and its output goes
to its log file.

:class:`WorkerProcess` answers like :class:`subprocess.Popen` (``poll``,
``wait``, ``kill``, ``terminate``, ``pid``, ``returncode``), so supervision
code does not care how it was started.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import time
from pathlib import Path

_CONTEXT = None
#: Imported once by the fork server: what every worker needs (torch, and the compiler stack
#: that building an optimizer imports, above all: a second each otherwise).
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.optim",
    "antdt.demo.trainer",
    "antdt.demo.training_async",
    "antdt.demo.training_sync",
    "antdt.demo.training_preduce",
    "antdt.worker.dataset",
    "antdt.worker.resources",
    "antdt.worker.ps.client",
    "antdt.worker.commits",
    "antdt.demo.server_node",
    "antdt.worker.ps.server",
    "antdt.cli.ps_cmd",
]
#: What a forked process runs: a module whose ``forked(argv)`` returns the exit code.
TRAINER, SERVER = "antdt.demo.trainer", "antdt.demo.server_node"


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _child(entry: str, argv: list[str], env: dict[str, str], log_path: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.exit(importlib.import_module(entry).forked(argv))


class WorkerProcess:
    """A forked demo process (a worker, or a parameter-server shard), with the parts of the Popen
    interface the harness uses."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, entry: str = TRAINER):
        self._process = _context().Process(
            target=_child, args=(entry, argv, env, str(log_path)), daemon=False
        )
        self._process.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            import subprocess

            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self._process.exitcode

    def kill(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()

    def terminate(self) -> None:
        if self._process.exitcode is None:
            self._process.terminate()

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self._process.pid, sig)


def warm_up(timeout_s: float = 120.0) -> float:
    """Start the fork server now (it imports torch): seconds it took. Later workers start at
    once."""
    started = time.monotonic()
    probe = _context().Process(target=os.getpid)
    probe.start()
    probe.join(timeout_s)
    return time.monotonic() - started
