"""Each training phase's CPU and wall time per call in torchrun's ranks: where a step's time goes.

In every Python process started with this folder on ``PYTHONPATH`` and
``PHASE_PROBE_DIR`` set (an absolute path), a worker that torchrun started
(``LOCAL_RANK`` set) wraps the methods a step of ``bench/user_job.py`` runs
through (:data:`PHASES`: DDP's forward, the backward pass, the optimizer's
step and, by mode, the ``DataLoader``'s next batch or ``ElasticJob``'s phases
and antdt's communication hook) with a clock read around each call, the
thread's CPU time (``time.thread_time``) and the wall time, and at exit
writes ``<dir>/<mode>-rank<R>-<pid>.json``: per phase its calls and mean
microseconds of CPU and of wall time, the main thread's and the process's
CPU seconds, and the cyclic collector's passes. A wall time well above the
CPU time is waiting: for the other ranks, for a core; the main thread's wait
for a core, runnable but not running, is read from Linux's schedstat
(``main_core_wait_s``, absent elsewhere). The job's set-up and close are
phases too (one call a run). Summed with
``bench/phase_probe/summary.py DIR``. A clock read costs about a
microsecond a call, the same in every mode.

The variables' names do not start with ``ANTDT_``: the benches hand their
environment on without antdt's own settings.
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path

#: (module, class, method, label) wrapped in every mode; then those of the script's mode.
COMMON = [
    ("torch.nn.parallel", "DistributedDataParallel", "forward", "forward"),
    ("torch", "Tensor", "backward", "backward"),
    ("torch.optim", "SGD", "step", "optimizer step"),
]
PHASES = {
    "plain": [
        ("torch.utils.data.dataloader", "_BaseDataLoaderIter", "__next__", "loader: next batch"),
    ],
    "hook": [
        ("torch.utils.data.dataloader", "_BaseDataLoaderIter", "__next__", "loader: next batch"),
        ("antdt.worker.ddp_hook", "WeightedReduce", "launch", "hook: bucket sent"),
    ],
    "dd": [
        ("antdt.worker.elastic.job", "ElasticJob", "_advance", "job: step begins"),
        ("antdt.worker.feeds", "ShardFeed", "read", "feed: batch read"),
        ("antdt.worker.ddp_hook", "WeightedReduce", "launch", "hook: bucket sent"),
        ("antdt.worker.elastic.job", "ElasticJob", "_end_step", "job: step ends"),
        ("antdt.worker.agent", "Agent", "step", "agent: step"),
        # once a run (a checkpoint also every checkpoint_every_s): the job's fixed costs
        ("antdt.worker.training_job", "TrainingJob", "__enter__", "job: set-up"),
        ("antdt.worker.agent", "Agent", "__enter__", "set-up: the agent's clients"),
        ("antdt.worker.dataset", "ShardedDataset", "prepare", "set-up: the first request"),
        ("antdt.worker.training_job", "TrainingJob", "_checkpoint", "job: checkpoint"),
        ("antdt.worker.training_job", "TrainingJob", "__exit__", "job: close"),
    ],
}
_totals: dict[str, list] = {}
_collector: dict[str, float] = {"passes": 0, "s": 0.0, "began": 0.0}


def _mode() -> str:
    """The script's ``--mode`` (``bench/probe_args.py``, on ``bench/`` appended to the path)."""
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from probe_args import script_mode

    return script_mode()


def _wrap(module: str, owner: str, name: str, label: str) -> None:
    cls = getattr(importlib.import_module(module), owner)
    original = getattr(cls, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            total = _totals.setdefault(label, [0, 0.0, 0.0])
            total[0] += 1
            total[1] += time.thread_time() - cpu
            total[2] += time.perf_counter() - wall

    setattr(cls, name, timed)


def _main_core_wait_s() -> float | None:
    """Seconds the main thread was runnable but waiting for a core (Linux's schedstat), or
    None."""
    try:
        path = f"/proc/self/task/{threading.main_thread().native_id}/schedstat"
        return round(int(Path(path).read_text().split()[1]) / 1e9, 3)
    except (OSError, IndexError, ValueError):
        return None


def _count_collections(phase: str, info: dict) -> None:
    if phase == "start":
        _collector["began"] = time.perf_counter()
    else:
        _collector["passes"] += 1
        _collector["s"] += time.perf_counter() - _collector["began"]


def _install(folder: str) -> None:
    mode, rank = _mode(), os.environ["RANK"]
    for module, owner, name, label in COMMON + PHASES.get(mode, []):
        _wrap(module, owner, name, label)
    gc.callbacks.append(_count_collections)

    def write() -> None:
        figures = {
            "mode": mode,
            "rank": int(rank),
            "main_cpu_s": round(time.thread_time(), 3),
            "process_cpu_s": round(time.process_time(), 3),
            "main_core_wait_s": _main_core_wait_s(),
            "collector": {"passes": _collector["passes"], "s": round(_collector["s"], 4)},
            "phases": {
                label: {
                    "calls": calls,
                    "cpu_us": round(1e6 * cpu / calls, 1),
                    "wall_us": round(1e6 * wall / calls, 1),
                }
                for label, (calls, cpu, wall) in _totals.items()
            },
        }
        path = os.path.join(folder, f"{mode}-rank{rank}-{os.getpid()}.json")
        with open(path, "w") as handle:
            json.dump(figures, handle)

    atexit.register(write)


if os.environ.get("PHASE_PROBE_DIR") and "LOCAL_RANK" in os.environ:
    _install(os.environ["PHASE_PROBE_DIR"])
