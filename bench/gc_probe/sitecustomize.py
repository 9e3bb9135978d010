"""A probe of the cyclic collector's pauses in every Python process started with this folder on
``PYTHONPATH`` and ``GC_PROBE_DIR`` set (``bench/gc_pauses.py`` reads what it writes).

Each process appends one line per full pass (generation 2), and per younger pass that took more
than :data:`SLOW_S`, to ``<dir>/<pid>.txt`` (wall time, generation, milliseconds, objects
collected), and writes its command line to ``<dir>/<pid>.cmd``. A pass holds the interpreter
lock: no other thread of the process runs meanwhile (the sharder answers no grant).

Give both as absolute paths (a bench may start its processes elsewhere). The variable's name does
not start with ``ANTDT_``: the benches hand their environment on without antdt's own settings.
"""

from __future__ import annotations

import gc
import os
import time

#: A younger pass slower than this is written too (most take well under a millisecond).
SLOW_S = 0.003


def _install(folder: str) -> None:
    path = os.path.join(folder, f"{os.getpid()}.txt")
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took = time.perf_counter() - started[0]
        if info["generation"] == 2 or took > SLOW_S:
            with open(path, "a") as out:
                out.write(f"{time.time():.3f} {info['generation']} {took * 1000:.2f} ")
                out.write(f"{info['collected']}\n")

    with open("/proc/self/cmdline", "rb") as own, open(path[:-4] + ".cmd", "w") as out:
        out.write(own.read().replace(b"\0", b" ").decode(errors="replace").strip())
    gc.callbacks.append(timed)


if os.environ.get("GC_PROBE_DIR"):
    _install(os.environ["GC_PROBE_DIR"])
