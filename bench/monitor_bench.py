"""Monitor figures: Faust service events/s, onset-to-verdict latency, pure detector events/s.

    .venv/bin/python bench/monitor_bench.py [--json] [--only throughput,latency,detector]
        [--events 200000] [--jobs 60] [--seconds 90]

* throughput: ``antdt monitor`` as its own process (one Faust worker) on the
  embedded broker. ``--events`` synthetic reports (16-worker jobs, some with
  stragglers) are written to ``worker.metrics`` first; the monitor then reads
  them as fast as it can. events/s = reports processed / wall time between the
  first and the last processed, from its own ``/metrics`` counter (polled
  every 20 ms).
* latency: the same service fed in real time, as agents would: ``--jobs`` jobs
  of 8 workers report every 1 s (the default interval) and each job has two
  straggler episodes (factor 1.5, 2 or 4) whose onsets fall at random points
  inside a report interval. Latency = wall time the first STRAGGLER verdict of
  the episode is read from ``monitor.verdicts`` minus the wall time of the
  onset. It splits into detection (onset to the end of the report window
  that triggered the verdict: the k=2 reports the hysteresis needs) and
  pipeline (that report's send time to the verdict read back from Kafka).
  Verdicts on workers without an episode are counted as false positives.
* detector: the pure detector, in memory, 64 workers of one job.
"""

from __future__ import annotations

import random
import threading
import time

from benchlib import bench_parser, distribution, embedded_broker, emit, fresh_settings
from confluent_kafka import OFFSET_END, TopicPartition

from antdt.bus.clients import consuming, producing
from antdt.bus.config import FetchPace
from antdt.bus.readers import assign_now, poll_batch
from antdt.loadgen.traces import TraceSlowdown, TraceSpec, generate
from antdt.runtime.launch import service_process
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import VerdictKind
from antdt.services.monitor.detection import JobDetector
from antdt.topics import topic_spec

CODEC = SingleObjectCodec()
REPORTS = "antdt_monitor_reports_total"


# ---------------------------------------------------------------- throughput


def throughput_reports(events: int) -> list:
    """Reports of 16-worker jobs, one in four with a 2x straggler, interleaved in time order."""
    workers, seconds = 16, 120
    jobs = max(1, events // (workers * seconds) + 1)
    reports = []
    for j in range(jobs):
        episodes = [TraceSlowdown("w3", 30, 120, 2.0)] if j % 4 == 0 else []
        reports += generate(
            TraceSpec(workers=workers, seconds=seconds, episodes=episodes, job_id=f"job-{j}"),
            seed=j,
        )
    reports.sort(key=lambda r: r.window_end)
    return reports[:events]


def bench_throughput(events: int) -> dict:
    reports = throughput_reports(events)
    with embedded_broker() as broker:
        settings = fresh_settings(broker)
        with producing(settings) as producer:
            for report in reports:
                producer.produce(
                    settings.topic("worker", "metrics"),
                    key=report.job_id.encode(),
                    value=CODEC.encode(report),
                )
                producer.poll(0)
        with service_process(settings, "monitor") as monitor:
            monitor.wait_ready()
            first = last = None
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                done = monitor.metric(REPORTS)
                now = time.perf_counter()
                if done > 0 and first is None:
                    first = (now, done)
                if done >= len(reports):
                    last = (now, done)
                    break
                time.sleep(0.25)
            metrics = monitor.metrics()
    if first is None or last is None:
        raise SystemExit(
            f"the monitor processed {metrics.get(REPORTS, 0):.0f} of {len(reports)} reports"
        )
    seconds = last[0] - first[0]
    verdicts = sum(v for k, v in metrics.items() if k.startswith("antdt_monitor_verdicts_total{"))
    return {
        "events": len(reports),
        "seconds": round(seconds, 3),
        "events_per_s": round((last[1] - first[1]) / seconds),
        "verdicts": int(verdicts),
        "deadlettered": int(metrics.get("antdt_monitor_deadlettered_total", 0)),
    }


# ---------------------------------------------------------------- latency


def latency_specs(
    jobs: int, seconds: float, start_s: float, rng: random.Random
) -> tuple[list[TraceSpec], dict]:
    """Two episodes per job at random phases; {(job, worker, onset wall time): factor}."""
    specs, onsets = [], {}
    for j in range(jobs):
        job, worker = f"job-{j}", f"w{rng.randrange(8)}"
        factor = (1.5, 2.0, 4.0)[j % 3]
        first = rng.uniform(15, seconds / 2 - 12)
        second = rng.uniform(seconds / 2 + 3, seconds - 12)
        episodes = [
            TraceSlowdown(worker, first, first + 10, factor),
            TraceSlowdown(worker, second, seconds, factor),
        ]
        specs.append(
            TraceSpec(workers=8, seconds=seconds, episodes=episodes, job_id=job, start_s=start_s)
        )
        for onset in (first, second):
            onsets[(job, worker, start_s + onset)] = factor
    return specs, onsets


def replay_in_real_time(settings, reports, stop: threading.Event) -> None:
    """Send each report at its window end, as an agent's reporter thread would."""
    topic = settings.topic("worker", "metrics")
    with producing(settings) as producer:
        for report in reports:
            delay = report.window_end.timestamp() - time.time()
            if delay > 0 and stop.wait(delay):
                return
            producer.produce(topic, key=report.job_id.encode(), value=CODEC.encode(report))
            producer.poll(0)


def collect_verdicts(settings, partitions: int, until: float) -> list[tuple[float, object]]:
    """(wall time read, verdict) for every verdict published until ``until``."""
    topic, seen = settings.topic("monitor", "verdicts"), []
    with consuming(settings, pace=FetchPace.LOW_LATENCY) as consumer:
        assign_now(consumer, [TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
        while time.time() < until:
            for message in poll_batch(consumer, 500, 0.05):
                seen.append((time.time(), CODEC.decode(message.value())))
    return seen


def score(onsets: dict, seen: list) -> dict:
    """Latency per onset (first STRAGGLER verdict after it), misses and false positives."""
    delays, detection, pipeline, by_factor, missed = [], [], [], {}, 0
    stragglers = [(t, v) for t, v in seen if v.kind is VerdictKind.STRAGGLER]
    for (job, worker, onset), factor in onsets.items():
        hits = [
            (t, v)
            for t, v in stragglers
            if v.job_id == job and v.worker_id == worker and onset <= v.issued_at.timestamp()
        ]
        if not hits:
            missed += 1
            continue
        read_at, verdict = min(hits, key=lambda hit: hit[0])
        delays.append(read_at - onset)
        detection.append(verdict.issued_at.timestamp() - onset)
        pipeline.append(read_at - verdict.issued_at.timestamp())
        by_factor.setdefault(f"{factor}x", []).append(read_at - onset)
    slow_workers = {(job, worker) for job, worker, _ in onsets}
    false_positive = sum(
        1
        for _, v in seen
        if v.kind is not VerdictKind.CLEARED and (v.job_id, v.worker_id) not in slow_workers
    )
    return {
        "onsets": len(onsets),
        "missed": missed,
        "false_positives": false_positive,
        "latency_s": distribution(delays),
        "of_which_detection_s": distribution(detection),
        "of_which_pipeline_s": distribution(pipeline),
        "latency_s_by_factor": {k: distribution(v) for k, v in sorted(by_factor.items())},
    }


def bench_latency(jobs: int, seconds: float) -> dict:
    rng = random.Random(7)
    with embedded_broker() as broker:
        settings = fresh_settings(broker)
        with service_process(settings, "monitor") as monitor:
            monitor.wait_ready()
            start_s = float(int(time.time()) + 3)
            specs, onsets = latency_specs(jobs, seconds, start_s, rng)
            reports = sorted(
                (r for i, spec in enumerate(specs) for r in generate(spec, seed=i)),
                key=lambda r: r.window_end,
            )
            stop = threading.Event()
            sender = threading.Thread(
                target=replay_in_real_time, args=(settings, reports, stop), daemon=True
            )
            sender.start()
            try:
                seen = collect_verdicts(
                    settings,
                    topic_spec("monitor", "verdicts").partitions,
                    until=start_s + seconds + 5,
                )
            finally:
                stop.set()
                sender.join()
    return {
        "jobs": jobs,
        "workers_per_job": 8,
        "report_interval_s": 1.0,
        "reports": len(reports),
        **score(onsets, seen),
    }


# ---------------------------------------------------------------- pure detector


def bench_detector(workers: int = 64, seconds: float = 300) -> dict:
    reports = generate(
        TraceSpec(workers=workers, seconds=seconds, episodes=[TraceSlowdown("w1", 60, 200, 2.0)]),
        seed=0,
    )
    detector = JobDetector("trace")
    started = time.perf_counter()
    verdicts = sum(len(detector.observe(r)) for r in reports)
    elapsed = time.perf_counter() - started
    return {
        "events": len(reports),
        "workers": workers,
        "seconds": round(elapsed, 3),
        "events_per_s": round(len(reports) / elapsed),
        "verdicts": verdicts,
    }


def main() -> None:
    parser = bench_parser(__doc__, "throughput,latency,detector")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    parts = set(args.only.split(","))
    report: dict = {}
    if "detector" in parts:
        report["detector"] = bench_detector()
    if "throughput" in parts:
        report["throughput"] = bench_throughput(args.events)
    if "latency" in parts:
        report["latency"] = bench_latency(args.jobs, args.seconds)
    emit(report, args.json)


if __name__ == "__main__":
    main()
