"""CPU seconds of each thread of a torchrun job's ranks: where a rank's extra CPU goes.

Samples ``/proc`` every ``--every`` seconds until SIGINT or SIGTERM, for every
process whose command line names ``--match`` (the ranks; torchrun's own agent
is left out), and keeps each thread's last reading, so a rank that exited
still counts. Prints per rank process its mode (the script's ``--mode``), its
``RANK``, and its CPU seconds: the main thread (``main``: the training
loop), then the others summed by the name the kernel gives them (gloo's
``gloo_tcp_loop`` and ``pt_gloo_runloop``, librdkafka's ``rdk:*``, Python's
own threads all as ``python``). Run it beside the bench::

    python bench/thread_cpu.py --json > threads.json &
    python bench/torchrun_bench.py --ranks 3 --repeat 1 --modes lightning-dd ...
    kill %1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections import defaultdict

TICKS = os.sysconf("SC_CLK_TCK")


def _read(path: str, mode: str = "r"):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:  # the process or thread is gone
        return None


def rank_of(pid: str, match: str) -> tuple[str, str] | None:
    """(mode, rank) of a rank process whose command line names ``match``, else None."""
    raw = _read(f"/proc/{pid}/cmdline", "rb")
    if not raw:
        return None
    argv = raw.decode(errors="replace").split("\0")
    if not any(match in part for part in argv) or "torch.distributed.run" in argv:
        return None
    mode = argv[argv.index("--mode") + 1] if "--mode" in argv[:-1] else "?"
    environ = _read(f"/proc/{pid}/environ", "rb") or b""
    ranks = [item[5:].decode() for item in environ.split(b"\0") if item.startswith(b"RANK=")]
    return (mode, ranks[0]) if ranks else None


def thread_cpu(pid: str, tid: str) -> tuple[str, float] | None:
    """(name, CPU seconds) of one thread; the main thread is named ``main``."""
    stat = _read(f"/proc/{pid}/task/{tid}/stat")
    name = _read(f"/proc/{pid}/task/{tid}/comm")
    if stat is None or name is None:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    seconds = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    return ("main" if tid == pid else name.strip()), seconds


def sample(match: str, seen: dict) -> None:
    """One look at every rank process: each thread's latest CPU seconds into ``seen``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        rank = rank_of(pid, match)
        if rank is None:
            continue
        for tid in _listdir(f"/proc/{pid}/task"):
            reading = thread_cpu(pid, tid)
            if reading is not None:
                seen[(*rank, pid)][tid] = reading


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def summary(seen: dict) -> list[dict]:
    """Per rank process: mode, rank, pid, total CPU seconds and seconds by thread name."""
    rows = []
    for (mode, rank, pid), threads in sorted(seen.items()):
        by_name: dict[str, float] = defaultdict(float)
        for name, seconds in threads.values():
            by_name[name] += seconds
        ordered = dict(sorted(by_name.items(), key=lambda item: -item[1]))
        rows.append(
            {
                "mode": mode,
                "rank": int(rank),
                "pid": int(pid),
                "cpu_s": round(sum(ordered.values()), 2),
                "threads": {name: round(seconds, 2) for name, seconds in ordered.items()},
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default="user_job.py", help="in the ranks' command lines")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between looks")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    if args.every <= 0:
        parser.error("--every must be positive")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    seen: dict = defaultdict(dict)
    while not stop.is_set():
        sample(args.match, seen)
        stop.wait(args.every)
    rows = summary(seen)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(row["mode"], row["rank"], row["cpu_s"], row["threads"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
