"""Codec speed: microseconds to encode and decode one WorkerMetrics.

Runs each operation in batches and reports the median and spread of the
per-message time over the batches, for the default single-object framing,
the Confluent framing (against an in-memory mock registry, so the figure is
the codec's own cost), and orjson for scale. Prints a table, or JSON with
--json.

    .venv/bin/python bench/codec_bench.py [--json] [--batches 30] [--batch-size 2000]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

from antdt.schemas.codec import ConfluentCodec, SingleObjectCodec, to_json
from antdt.schemas.examples import worker_metrics


def per_message_us(
    operation: Callable[[], object], batches: int, batch_size: int
) -> dict[str, float]:
    """Median, p10 and p90 over batches of the mean time per call, in µs."""
    for _ in range(batch_size):  # warm caches and lazy imports
        operation()
    samples = []
    for _ in range(batches):
        started = time.perf_counter()
        for _ in range(batch_size):
            operation()
        samples.append((time.perf_counter() - started) / batch_size * 1e6)
    samples.sort()
    return {
        "median_us": round(statistics.median(samples), 2),
        "p10_us": round(samples[int(0.1 * (len(samples) - 1))], 2),
        "p90_us": round(samples[int(0.9 * (len(samples) - 1))], 2),
    }


def measure(batches: int, batch_size: int) -> dict:
    message = worker_metrics()
    single = SingleObjectCodec()
    confluent = ConfluentCodec("mock://bench")
    single_bytes = single.encode(message)
    confluent_bytes = confluent.encode(message, "antdt.worker.metrics")
    return {
        "message": "WorkerMetrics (every nullable field set)",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "batches": batches,
        "batch_size": batch_size,
        "results": {
            "single_object.encode": {
                **per_message_us(lambda: single.encode(message), batches, batch_size),
                "bytes": len(single_bytes),
            },
            "single_object.decode": per_message_us(
                lambda: single.decode(single_bytes), batches, batch_size
            ),
            "confluent.encode": {
                **per_message_us(
                    lambda: confluent.encode(message, "antdt.worker.metrics"), batches, batch_size
                ),
                "bytes": len(confluent_bytes),
            },
            "confluent.decode": per_message_us(
                lambda: confluent.decode(confluent_bytes), batches, batch_size
            ),
            "json.encode (orjson, reference)": {
                **per_message_us(lambda: to_json(message), batches, batch_size),
                "bytes": len(to_json(message)),
            },
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=2000)
    args = parser.parse_args()
    report = measure(args.batches, args.batch_size)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['message']}, Python {report['python']}, {args.batches} x {args.batch_size} calls"
    )
    print(f"{'operation':34} {'median µs':>10} {'p10':>8} {'p90':>8} {'bytes':>6}")
    for name, row in report["results"].items():
        print(
            f"{name:34} {row['median_us']:>10.2f} {row['p10_us']:>8.2f} {row['p90_us']:>8.2f} "
            f"{row.get('bytes', ''):>6}"
        )


if __name__ == "__main__":
    main()
