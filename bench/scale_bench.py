"""Scale figures: one instance of each service under 100 to 1,000 simulated workers.

    .venv/bin/python bench/scale_bench.py [--workers 100,300,1000] [--jobs 1] [--seconds 75]
    [--repeat 3] [--sharder antdt|echo] [--json] [--plot scale.png]

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

``--sharder echo`` puts :mod:`grant_echo` in the sharder's place: the
grant's broker hops and nothing else, so its grant figures are the floor
this broker and machine allow with everything else running as usual.

Each point is run ``--repeat`` times (a fresh broker and services each
time); ``summary`` gives the median, min and max over the runs. Passes when,
at every point, the median run's onset to command p99 <= 5 s and grant p99
<= 50 ms, and in every run every straggler got a command and every lag is
flat; exits 1 otherwise.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
from benchlib import (
    cpu_seconds,
    distribution,
    embedded_broker,
    emit,
    fresh_settings,
    numbers,
    spread,
    stop_process,
)
from confluent_kafka import Consumer, TopicPartition

from antdt.bus.clients import make_consumer
from antdt.errors import AntdtError
from antdt.loadgen.driver import FleetDriver
from antdt.loadgen.fleet import FleetSpec
from antdt.runtime.launch import service_process, settings_env
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
        self.cpu_start = {name: cpu_seconds(p) for name, p in processes.items()}
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._readers = {
            name: make_consumer(settings, group_id=settings.group(group))
            for name, (group, _) in GROUPS.items()
        }
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.wall = time.monotonic() - self.began
        self.cpu_percent = {
            name: round(100 * (cpu_seconds(p) - self.cpu_start[name]) / self.wall, 1)
            for name, p in self.processes.items()
        }
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
        partitions = [
            TopicPartition(self.settings.topic(c, n), p)
            for c, n in topics
            for p in range(topic_spec(c, n).partitions)
        ]
        behind = 0
        for committed in reader.committed(partitions, timeout=5):
            _, end = reader.get_watermark_offsets(
                TopicPartition(committed.topic, committed.partition), timeout=5
            )
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
    return {
        "max": max(values),
        "median": sorted(values)[len(values) // 2],
        "growth_records": round(growth),
        "input_per_s": round(input_per_s),
        "flat": growth < max(input_per_s, 1.0),
        "series": points,
    }


class EchoSharder:
    """:mod:`grant_echo` as a child process, ready once it holds the sharder group's partitions."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    def raise_if_exited(self, what: str) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{what}: grant_echo exited with {self.process.returncode}")

    def wait_ready(self, timeout_s: float) -> None:
        readable, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not readable or self.process.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"grant_echo did not get its partitions within {timeout_s:g} s")


@contextmanager
def echo_sharder(settings: Settings) -> Iterator[EchoSharder]:
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("grant_echo.py"))],
        env={**os.environ, **settings_env(settings)},
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield EchoSharder(process)
    finally:
        stop_process(process, 10)


def run_point(workers: int, jobs: int, seconds: float, sharder: str = "antdt") -> dict:
    spec = FleetSpec(
        jobs=jobs, workers_per_job=workers // jobs, onset_from_s=20.0, onset_until_s=seconds - 15.0
    )
    with embedded_broker() as broker, ExitStack() as services:
        settings = fresh_settings(broker)
        running = {
            name: services.enter_context(service_process(settings, name))
            for name in ("monitor", "controller")
        }
        running["sharder"] = services.enter_context(
            service_process(settings, "sharder") if sharder == "antdt" else echo_sharder(settings)
        )
        for service in running.values():
            service.wait_ready(90)
        processes = {name: psutil.Process(s.process.pid) for name, s in running.items()}
        processes["broker"] = psutil.Process(broker.pid)
        processes["loadgen"] = psutil.Process()
        driver = FleetDriver(settings, spec)
        with Probe(settings, processes) as probe:
            seen = driver.run(seconds)
        for name, service in running.items():
            service.raise_if_exited(f"{name} during the run")  # its figures would be a dead one's
        rates = {
            "monitor": workers / spec.report_interval_s,
            "controller": workers / spec.report_interval_s,
            "sharder": workers
            * (1 / spec.shard_s + 1 / (spec.shard_s * spec.quota) + 1 / spec.heartbeat_interval_s),
        }
        onsets = seen.onset_to_command_s()
        return {
            "workers": workers,
            "jobs": jobs,
            "seconds": seconds,
            "sharder": sharder,
            "records_sent": driver.sent,
            "records_per_s": round(driver.sent / probe.wall),
            "stragglers": driver.fleet.stragglers,
            "stragglers_commanded": len(onsets),
            "onset_to_command_s": distribution(onsets, 2),
            **grant_figures(seen.grants, WARMUP_S),
            # by the broker
            "request_acked_ms": distribution([a * 1000 for a in driver.acked_s], 2),
            "commands": seen.commands,
            "commands_to_workers_not_straggling": seen.commands_to_the_unhurried,
            "lag": {name: lag_figures(probe.lag[name], rates[name], WARMUP_S) for name in GROUPS},
            "cpu_percent": probe.cpu_percent,
            "rss_mb": {k: round(v / 2**20) for k, v in probe.rss.items()},
        }


def grant_figures(grants: list, warmup_s: float) -> dict:
    """Steady-state grants (sent after the warm-up), split at the sharder's stamp; the job's first
    grants apart."""
    steady = [g for g in grants if g.sent_s >= warmup_s]
    first = [g for g in grants if g.sent_s < 1.0]
    return {
        "grant_ms": distribution([g.read_s * 1000 for g in steady], 2),
        "grant_split_ms": {
            "to_stamped_answer": distribution([g.stamped_s * 1000 for g in steady], 2),
            "stamp_to_read": distribution([(g.read_s - g.stamped_s) * 1000 for g in steady], 2),
        },
        # the sharder takes the job over
        "first_grant_ms": distribution([g.read_s * 1000 for g in first], 1),
    }


def summarize(runs: list[dict]) -> dict:
    """One point from its runs: the figures the targets and the plot use, as median, min and max."""

    def over(figure) -> dict:
        values = [figure(run) for run in runs]
        return (
            spread([v for v in values if v is not None])
            if any(v is not None for v in values)
            else {}
        )

    return {
        "runs": len(runs),
        "onset_to_command_p50_s": over(lambda r: r["onset_to_command_s"].get("p50")),
        "onset_to_command_p99_s": over(lambda r: r["onset_to_command_s"].get("p99")),
        "grant_p50_ms": over(lambda r: r["grant_ms"].get("p50")),
        "grant_p99_ms": over(lambda r: r["grant_ms"].get("p99")),
        "request_to_stamp_p99_ms": over(
            lambda r: r["grant_split_ms"]["to_stamped_answer"].get("p99")
        ),
        "stamp_to_read_p99_ms": over(lambda r: r["grant_split_ms"]["stamp_to_read"].get("p99")),
        "request_acked_p99_ms": over(lambda r: r["request_acked_ms"].get("p99")),
        "records_per_s": over(lambda r: r["records_per_s"]),
        "stragglers": sum(r["stragglers"] for r in runs),
        "stragglers_commanded": sum(r["stragglers_commanded"] for r in runs),
        "lag_growth_records": {
            name: over(lambda r, n=name: r["lag"][n]["growth_records"]) for name in GROUPS
        },
        "lag_flat_runs": {name: sum(r["lag"][name]["flat"] for r in runs) for name in GROUPS},
        "cpu_percent": {
            name: over(lambda r, n=name: r["cpu_percent"][n]) for name in runs[0]["cpu_percent"]
        },
        "rss_mb": {name: over(lambda r, n=name: r["rss_mb"][n]) for name in runs[0]["rss_mb"]},
    }


def verdict(point: dict) -> list[str]:
    summary, problems = point["summary"], []
    if summary["stragglers_commanded"] < summary["stragglers"]:
        problems.append(
            f"{summary['stragglers'] - summary['stragglers_commanded']} stragglers got no command"
        )
    onset, grant = (
        summary["onset_to_command_p99_s"].get("median"),
        summary["grant_p99_ms"].get("median"),
    )
    if onset is None or onset > ONSET_TO_COMMAND_P99_S:
        problems.append(f"onset to command p99 {onset} s > {ONSET_TO_COMMAND_P99_S}")
    if grant is None or grant > GRANT_P99_MS:
        problems.append(f"grant p99 {grant} ms > {GRANT_P99_MS}")
    problems += [
        f"{name} lag grew in {summary['runs'] - flat} of {summary['runs']} runs"
        for name, flat in summary["lag_flat_runs"].items()
        if flat < summary["runs"]
    ]
    return [f"{point['workers']} workers: {p}" for p in problems]


def plot(points: list[dict], path: Path) -> None:
    """Medians against the worker count, min to max as error bars; the first run's lag over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = [p["workers"] for p in points]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    summaries = [p["summary"] for p in points]
    series = [
        (
            "onset to command, s",
            {
                "p50": [s["onset_to_command_p50_s"] for s in summaries],
                "p99": [s["onset_to_command_p99_s"] for s in summaries],
            },
            ONSET_TO_COMMAND_P99_S,
        ),
        (
            "grant, ms",
            {
                "p50": [s["grant_p50_ms"] for s in summaries],
                "p99": [s["grant_p99_ms"] for s in summaries],
            },
            GRANT_P99_MS,
        ),
        (
            "CPU, % of one core",
            {n: [s["cpu_percent"][n] for s in summaries] for n in summaries[0]["cpu_percent"]},
            None,
        ),
        (
            "peak RSS, MiB",
            {n: [s["rss_mb"][n] for s in summaries] for n in summaries[0]["rss_mb"]},
            None,
        ),
    ]
    for ax, (title, lines, bar) in zip(axes.flat, series):
        for label, spreads in lines.items():
            medians = [s.get("median", float("nan")) for s in spreads]
            below = [m - s.get("min", m) for m, s in zip(medians, spreads)]
            above = [s.get("max", m) - m for m, s in zip(medians, spreads)]
            ax.errorbar(workers, medians, yerr=[below, above], marker="o", capsize=3, label=label)
        if bar is not None:
            ax.axhline(bar, color="red", linestyle="--", linewidth=1, label="target")
        ax.set_title(f"{title} (median, min-max)")
        ax.set_xlabel("simulated workers")
        ax.legend(fontsize=8)
    for ax, name in zip(list(axes.flat)[4:], ("monitor", "sharder")):
        for p in points:
            ts, vs = (
                zip(*p["each"][0]["lag"][name]["series"])
                if p["each"][0]["lag"][name]["series"]
                else ((), ())
            )
            ax.plot(ts, vs, label=f"{p['workers']} workers")
        ax.set_title(f"{name} consumer lag over time (first run), records")
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
    parser.add_argument(
        "--sharder",
        choices=("antdt", "echo"),
        default="antdt",
        help="echo: the grant's broker hops only, for the floor (see grant_echo.py)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per point (median, min and max over them)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--plot", type=Path, help="write the figures against the worker count to this PNG"
    )
    parser.add_argument(
        "--series", action="store_true", help="keep the lag time series in the JSON"
    )
    args = parser.parse_args()
    counts = numbers(parser, "--workers", args.workers)
    if args.seconds < 40 or any(c < args.jobs or c % args.jobs for c in counts):
        parser.error("--seconds must be >= 40 and every worker count a multiple of --jobs")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    points = []
    for count in counts:
        runs = []
        for attempt in range(args.repeat):
            began = time.monotonic()
            try:
                runs.append(run_point(count, args.jobs, args.seconds, args.sharder))
            except (AntdtError, RuntimeError) as exc:
                sys.exit(f"scale bench FAILED: {count} workers, run {attempt + 1}: {exc}")
            runs[-1]["run_wall_s"] = round(time.monotonic() - began, 1)
            print(
                (
                    f"{count} workers, run {attempt + 1}/{args.repeat}: "
                    f"done in {runs[-1]['run_wall_s']} s"
                ),
                file=sys.stderr,
                flush=True,
            )
        points.append(
            {
                "workers": count,
                "jobs": args.jobs,
                "sharder": args.sharder,
                "summary": summarize(runs),
                "each": runs,
            }
        )
    if args.plot:
        plot(points, args.plot)
    if not args.series:
        for run in (run for point in points for run in point["each"]):
            for lag in run["lag"].values():
                lag.pop("series")
    problems = [p for point in points for p in verdict(point)]
    emit(
        {
            "points": points,
            "passed": not problems,
            "problems": problems,
            "targets": {
                "onset_to_command_p99_s": ONSET_TO_COMMAND_P99_S,
                "grant_p99_ms": GRANT_P99_MS,
            },
            "repeat": args.repeat,
        },
        args.json,
    )
    if problems:
        print("scale bench FAILED: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
