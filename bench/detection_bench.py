"""Pure detector throughput: WorkerMetrics events per second (no Kafka).

    .venv/bin/python bench/detection_bench.py [--json] [--workers 64] [--seconds 300]
"""

from __future__ import annotations

import argparse
import json
import time

from antdt.services.monitor.detection import JobDetector
from antdt.services.monitor.traces import Episode, TraceSpec, generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=300)
    args = parser.parse_args()
    spec = TraceSpec(workers=args.workers, seconds=args.seconds, episodes=[Episode("w1", 60, 200, 2.0)])
    reports = generate(spec, seed=0)
    detector = JobDetector("trace")
    started = time.perf_counter()
    verdicts = sum(len(detector.observe(r)) for r in reports)
    elapsed = time.perf_counter() - started
    report = {"events": len(reports), "workers": args.workers, "seconds": round(elapsed, 3),
              "events_per_s": round(len(reports) / elapsed), "verdicts": verdicts}
    print(json.dumps(report, indent=2) if args.json else report)


if __name__ == "__main__":
    main()
