"""cProfile of chosen torchrun ranks' main threads, in every Python process started with this
folder on ``PYTHONPATH`` and ``RANK_PROFILE_DIR`` set (an absolute path).

A worker that torchrun started (``LOCAL_RANK`` set) whose ``RANK`` is in ``RANK_PROFILE_RANKS``
(comma-separated, default ``0``) profiles its main thread from start-up to exit and writes
``<dir>/<mode>-rank<R>-<pid>.prof`` (``mode`` from the script's ``--mode``, else ``run``): the
breakdown of a rank's time by function that docs/frameworks.md compares between a framework's own
DDP and antdt's. A process ended by ``os._exit`` (a broken group's exit 77) writes nothing.

The variables' names do not start with ``ANTDT_``: the benches hand their environment on without
antdt's own settings.
"""

from __future__ import annotations

import atexit
import cProfile
import os
import sys
from pathlib import Path


def _mode() -> str:
    """The script's ``--mode`` (``bench/probe_args.py``, on ``bench/`` appended to the path)."""
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from probe_args import script_mode

    return script_mode()


def _install(folder: str) -> None:
    rank = os.environ["RANK"]
    profile = cProfile.Profile()
    path = os.path.join(folder, f"{_mode()}-rank{rank}-{os.getpid()}.prof")

    def write() -> None:
        profile.disable()
        profile.dump_stats(path)

    atexit.register(write)
    profile.enable()


def _chosen() -> bool:
    ranks = os.environ.get("RANK_PROFILE_RANKS", "0").split(",")
    return "LOCAL_RANK" in os.environ and os.environ.get("RANK") in ranks


if os.environ.get("RANK_PROFILE_DIR") and _chosen():
    _install(os.environ["RANK_PROFILE_DIR"])
