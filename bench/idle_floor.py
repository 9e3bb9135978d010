"""``antdt up`` with nothing to do: each process's CPU, and each service's share of the broker's.

    .venv/bin/python bench/idle_floor.py [--window-s 15] [--repeat 3] [--json]

On a machine whose cores the ranks fill, every CPU second ``antdt up``
spends is a second the ranks wait for a core (docs/torchrun.md), and most of
what the services cost a short job is this floor. The embedded broker does
nothing of its own: its CPU is the answers to the services' requests, so
each service's share of it is measured by stopping that service (SIGSTOP)
for a window and reading what the broker used meanwhile. Each window is
repeated; figures are percent of one core, median (min-max).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import psutil
from benchlib import UP_SERVICES, antdt_up, bench_parser, cpu_seconds, emit, spread, up_processes

#: After a stop or a continue, before the window: the clients' requests in flight are answered.
SETTLE_S = 3.0


def percent_over(measured: dict[str, psutil.Process], window_s: float) -> dict[str, float]:
    before = {name: cpu_seconds(process) for name, process in measured.items()}
    time.sleep(window_s)
    return {
        name: 100 * (cpu_seconds(process) - before[name]) / window_s
        for name, process in measured.items()
    }


def broker_with_stopped(found: dict[str, psutil.Process], stopped: tuple, window_s: float) -> float:
    """The broker's CPU (percent of a core) over a window with the ``stopped`` services stopped."""
    for service in stopped:
        os.kill(found[service].pid, signal.SIGSTOP)
    try:
        time.sleep(SETTLE_S)
        return percent_over({"broker": found["broker"]}, window_s)["broker"]
    finally:
        for service in stopped:
            os.kill(found[service].pid, signal.SIGCONT)
        time.sleep(SETTLE_S)


def main() -> int:
    parser = bench_parser(__doc__, "idle")
    parser.add_argument("--window-s", type=float, default=15.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--policy", default="antdt-dd")
    args = parser.parse_args()
    if args.window_s <= 0 or args.repeat < 1:
        parser.error("--window-s must be > 0 and --repeat at least 1")
    idle: dict[str, list[float]] = {}
    broker_with: dict[str, list[float]] = {}
    with (
        tempfile.TemporaryDirectory() as logs,
        antdt_up(Path(logs), ["--policy", args.policy]) as bus,
    ):
        try:
            found = up_processes(psutil.Process(bus.process.pid))
        except RuntimeError as missing:  # names what antdt up lacks
            print(f"idle_floor: {missing}", flush=True)
            return 1
        time.sleep(SETTLE_S)
        for _ in range(args.repeat):
            for name, value in percent_over(found, args.window_s).items():
                idle.setdefault(name, []).append(value)
            for stopped in [(service,) for service in UP_SERVICES] + [UP_SERVICES]:
                share = broker_with_stopped(found, stopped, args.window_s)
                broker_with.setdefault("+".join(stopped), []).append(share)
    broker = idle["broker"]
    report = {
        "settings": {"window_s": args.window_s, "repeat": args.repeat, "policy": args.policy},
        "idle_percent_of_a_core": {name: spread(values, 2) for name, values in idle.items()},
        "broker_percent_with_services_stopped": {
            service: spread(values, 2) for service, values in broker_with.items()
        },
        # what the broker spends answering each service (and all three): its CPU less its CPU
        # with them stopped, window by window; with all stopped, what is left is its own floor
        "broker_share_percent": {
            stopped: spread([b - s for b, s in zip(broker, values, strict=True)], 2)
            for stopped, values in broker_with.items()
        },
    }
    emit(report, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
