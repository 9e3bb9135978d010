"""Scale figures: one instance of each service under 100 to 1,000 simulated workers.

    .venv/bin/python bench/scale_bench.py [--workers 100,300,1000] [--jobs 1] [--seconds 75] [--repeat 1]
        [--json] [--plot scale.png]

For each worker count: a fresh embedded broker, ``antdt monitor``,
``antdt controller`` (AntDT-ND) and ``antdt sharder`` as their own
processes, and a fleet of simulated agents (:mod:`antdt.loadgen`, one
process, no torch) at the agent's cadence: a metrics report a second, a
heartbeat every 5 s, a shard of 2 s pulled two at a time. 2 % of each
job's workers (at least one) turn 3x slower at a random time between 20 s
and 15 s before the end. Reported per point:

* onset to command: from a straggler's onset to the first command the fleet
  reads for it (median, p99; every straggler must get one);
* grant: from a shard request handed to the producer to its answer read back;
* lag: each service's consumer group, committed offset behind the end of
  its input topics, sampled every second; ``flat`` when it grew by less than
  one second of input over the measured window (least squares);
* CPU (percent of one core, mean over the run) and peak RSS of each service
  and the broker.

Passes when, at every point, onset to command p99 <= 5 s, grant p99 <= 50 ms
and every lag is flat; exits 1 otherwise.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import psutil
from benchlib import distribution, embedded_broker, emit, fresh_settings, numbers
from confluent_kafka import Consumer, TopicPartition

from antdt.bus.clients import make_consumer
from antdt.launch import service_process
from antdt.loadgen.driver import FleetDriver
from antdt.loadgen.fleet import FleetSpec
from antdt.settings import Settings
from antdt.topics import topic_spec

ONSET_TO_COMMAND_P99_S = 5.0
WARMUP_S = 10.0  # the services take the jobs over; lag and grants are measured after it
GRANT_P99_MS = 50.0

#: Each service's consumer group (suffix of the topic prefix) and the topics it reads.
GROUPS = {
    "monitor": ("monitor", [("worker", "metrics")]),
    "controller": ("controller", [("monitor", "verdicts"), ("worker", "metrics")]),
    "sharder": ("sharder", [("shard", "progress"), ("worker", "lifecycle")]),
}


class Probe:
    """Samples every second: each group's lag, each process's CPU time and RSS."""

    def __init__(self, settings: Settings, processes: dict[str, psutil.Process]):
        self.settings, self.processes = settings, processes
        self.lag: dict[str, list[tuple[float, int]]] = {name: [] for name in GROUPS}
        self.rss: dict[str, int] = {name: 0 for name in processes}
        self.cpu_start = {name: self._cpu(p) for name, p in processes.items()}
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._readers = {name: make_consumer(settings, group_id=f"{settings.topic_prefix}.{group}")
                         for name, (group, _) in GROUPS.items()}
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _cpu(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.wall = time.monotonic() - self.began
        self.cpu_percent = {name: round(100 * (self._cpu(p) - self.cpu_start[name]) / self.wall, 1)
                            for name, p in self.processes.items()}
        for reader in self._readers.values():
            reader.close()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            now = time.monotonic() - self.began
            for name, (_, topics) in GROUPS.items():
                self.lag[name].append((round(now, 1), self._lag_of(self._readers[name], topics)))
            for name, process in self.processes.items():
                self.rss[name] = max(self.rss[name], process.memory_info().rss)

    def _lag_of(self, reader: Consumer, topics: list[tuple[str, str]]) -> int:
        partitions = [TopicPartition(self.settings.topic(c, n), p) for c, n in topics
                      for p in range(topic_spec(c, n).partitions)]
        behind = 0
        for committed in reader.committed(partitions, timeout=5):
            _, end = reader.get_watermark_offsets(TopicPartition(committed.topic, committed.partition), timeout=5)
            behind += max(0, end - max(committed.offset, 0))
        return behind


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares growth of lag, records per second."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread if spread else 0.0


def lag_figures(points: list[tuple[float, int]], input_per_s: float, warmup_s: float) -> dict:
    measured = [(t, v) for t, v in points if t >= warmup_s]
    growth = slope(measured) * (measured[-1][0] - measured[0][0]) if len(measured) > 1 else 0.0
    values = [v for _, v in measured] or [0]
    return {"max": max(values), "median": sorted(values)[len(values) // 2], "growth_records": round(growth),
            "input_per_s": round(input_per_s), "flat": growth < max(input_per_s, 1.0), "series": points}


def run_point(workers: int, jobs: int, seconds: float) -> dict:
    spec = FleetSpec(jobs=jobs, workers_per_job=workers // jobs, onset_from_s=20.0, onset_until_s=seconds - 15.0)
    with embedded_broker() as broker, ExitStack() as services:
        settings = fresh_settings(broker)
        running = {name: services.enter_context(service_process(settings, name, *args))
                   for name, args in (("monitor", ()), ("controller", ()), ("sharder", ()))}
        for service in running.values():
            service.wait_ready(90)
        processes = {name: psutil.Process(s.process.pid) for name, s in running.items()}
        processes["broker"] = psutil.Process(broker.pid)
        processes["loadgen"] = psutil.Process()
        driver = FleetDriver(settings, spec)
        with Probe(settings, processes) as probe:
            seen = driver.run(seconds)
        rates = {"monitor": workers / spec.report_interval_s, "controller": workers / spec.report_interval_s,
                 "sharder": workers * (1 / spec.shard_s + 1 / (spec.shard_s * spec.quota) + 1 / spec.heartbeat_interval_s)}
        onsets = seen.onset_to_command_s()
        return {
            "workers": workers, "jobs": jobs, "seconds": seconds, "records_sent": driver.sent,
            "records_per_s": round(driver.sent / probe.wall),
            "stragglers": driver.fleet.stragglers, "stragglers_commanded": len(onsets),
            "onset_to_command_s": distribution(onsets, 2),
            **grant_figures(seen.grants, WARMUP_S),
            "request_acked_ms": distribution([a * 1000 for a in driver.acked_s], 2),  # by the broker
            "commands": seen.commands, "commands_to_workers_not_straggling": seen.commands_to_the_unhurried,
            "lag": {name: lag_figures(probe.lag[name], rates[name], WARMUP_S) for name in GROUPS},
            "cpu_percent": probe.cpu_percent, "rss_mb": {k: round(v / 2**20) for k, v in probe.rss.items()},
        }


def grant_figures(grants: list, warmup_s: float) -> dict:
    """Steady-state grants (sent after the warm-up), split at the sharder's stamp; the job's first grants apart."""
    steady = [g for g in grants if g.sent_s >= warmup_s]
    first = [g for g in grants if g.sent_s < 1.0]
    return {
        "grant_ms": distribution([g.read_s * 1000 for g in steady], 2),
        "grant_split_ms": {"to_stamped_answer": distribution([g.stamped_s * 1000 for g in steady], 2),
                           "stamp_to_read": distribution([(g.read_s - g.stamped_s) * 1000 for g in steady], 2)},
        "first_grant_ms": distribution([g.read_s * 1000 for g in first], 1),  # the sharder takes the job over
    }


def verdict(point: dict) -> list[str]:
    problems = []
    if point["stragglers_commanded"] < point["stragglers"]:
        problems.append(f"{point['stragglers'] - point['stragglers_commanded']} stragglers got no command")
    if point["onset_to_command_s"].get("p99", float("inf")) > ONSET_TO_COMMAND_P99_S:
        problems.append(f"onset to command p99 {point['onset_to_command_s'].get('p99')} s > {ONSET_TO_COMMAND_P99_S}")
    if point["grant_ms"].get("p99", float("inf")) > GRANT_P99_MS:
        problems.append(f"grant p99 {point['grant_ms'].get('p99')} ms > {GRANT_P99_MS}")
    problems += [f"{name} lag grew by {lag['growth_records']} records" for name, lag in point["lag"].items()
                 if not lag["flat"]]
    return [f"{point['workers']} workers: {p}" for p in problems]


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = [p["workers"] for p in points]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    series = [
        ("onset to command, s", {"p50": [p["onset_to_command_s"].get("p50") for p in points],
                                 "p99": [p["onset_to_command_s"].get("p99") for p in points]}, ONSET_TO_COMMAND_P99_S),
        ("grant, ms", {"p50": [p["grant_ms"].get("p50") for p in points],
                       "p99": [p["grant_ms"].get("p99") for p in points]}, GRANT_P99_MS),
        ("CPU, % of one core", {n: [p["cpu_percent"][n] for p in points] for n in points[0]["cpu_percent"]}, None),
        ("peak RSS, MiB", {n: [p["rss_mb"][n] for p in points] for n in points[0]["rss_mb"]}, None),
    ]
    for ax, (title, lines, bar) in zip(axes.flat, series):
        for label, values in lines.items():
            ax.plot(workers, values, marker="o", label=label)
        if bar is not None:
            ax.axhline(bar, color="red", linestyle="--", linewidth=1, label="target")
        ax.set_title(title)
        ax.set_xlabel("simulated workers")
        ax.legend(fontsize=8)
    for ax, name in zip(list(axes.flat)[4:], ("monitor", "sharder")):
        for p in points:
            ts, vs = zip(*p["lag"][name]["series"]) if p["lag"][name]["series"] else ((), ())
            ax.plot(ts, vs, label=f"{p['workers']} workers")
        ax.set_title(f"{name} consumer lag over time, records")
        ax.set_xlabel("s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="100,300,1000", help="comma-separated worker counts")
    parser.add_argument("--jobs", type=int, default=1, help="jobs the workers are split into")
    parser.add_argument("--seconds", type=float, default=75.0, help="load per point (at least 40)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--plot", type=Path, help="write the figures against the worker count to this PNG")
    parser.add_argument("--series", action="store_true", help="keep the lag time series in the JSON")
    args = parser.parse_args()
    counts = numbers(parser, "--workers", args.workers)
    if args.seconds < 40 or any(c < args.jobs or c % args.jobs for c in counts):
        parser.error("--seconds must be >= 40 and every worker count a multiple of --jobs")
    points = []
    for count in counts:
        began = time.monotonic()
        point = run_point(count, args.jobs, args.seconds)
        point["point_wall_s"] = round(time.monotonic() - began, 1)
        points.append(point)
        print(f"{count} workers: done in {point['point_wall_s']} s", file=sys.stderr, flush=True)
    if args.plot:
        plot(points, args.plot)
    if not args.series:
        for point in points:
            for lag in point["lag"].values():
                lag.pop("series")
    problems = [p for point in points for p in verdict(point)]
    emit({"points": points, "passed": not problems, "problems": problems,
          "targets": {"onset_to_command_p99_s": ONSET_TO_COMMAND_P99_S, "grant_p99_ms": GRANT_P99_MS}}, args.json)
    if problems:
        print("scale bench FAILED: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
