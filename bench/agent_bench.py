"""Agent overhead per training step, and events per second per worker.

    .venv/bin/python bench/agent_bench.py [--json] [--steps 200000] [--seconds 10] [--repeat 3]

* overhead: ``agent.step()`` timed call by call (perf_counter_ns around each
  call, minus the cost of the two timer reads measured the same way around
  nothing), with the agent fully running on the embedded broker: reporter,
  emitter and command listener threads live. Also whole loops: N iterations
  with and without ``agent.step()``, and entering and leaving
  ``agent.sync_wait()`` (its CUDA check; on a GPU it also waits for the
  queued work, which is the point). Repeated ``--repeat`` times.
* commit: ``agent.step()`` after a batch of 32 tagged samples from two shard
  grants, the step that commits them (one COMMIT report produced, not
  waited for), timed the same way.
* events: a worker stepping at ~1 kHz for N seconds at default settings
  (1 s report interval, 5 s heartbeat); events counted on the topics.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchlib import embedded_broker, fresh_settings, percentile, spread
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import consuming
from antdt.bus.markers import marker_id
from antdt.bus.readers import assign_now, poll_batch
from antdt.settings import Settings
from antdt.topics import topic_spec
from antdt.worker.agent import Agent
from antdt.worker.provenance import SampleTag, Tagged


def timed_calls(call, n: int) -> list[int]:
    clock = time.perf_counter_ns
    samples = [0] * n
    for i in range(n):
        started = clock()
        call()
        samples[i] = clock() - started
    return samples


def enter_sync_wait(agent: Agent) -> None:
    with agent.sync_wait():
        pass


def bench_overhead(settings: Settings, steps: int) -> dict:
    import torch  # noqa: F401 - a training process has it: the CUDA check in sync_wait looks at it

    with Agent("bench-overhead", "w0", settings=settings) as agent:
        nothing = timed_calls(lambda: None, steps)
        with_step = timed_calls(agent.step, steps)
        with_sync = timed_calls(lambda: enter_sync_wait(agent), steps)
        started = time.perf_counter()
        for _ in range(steps):
            pass
        bare_loop = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(steps):
            agent.step()
        agent_loop = time.perf_counter() - started
    base = statistics.median(nothing)
    overhead = [max(0, s - base) for s in with_step]
    return {
        "steps": steps,
        "step_call_overhead_us": {
            "median": round(statistics.median(overhead) / 1000, 3),
            "p99": round(percentile(overhead, 0.99) / 1000, 3),
            "mean": round(statistics.fmean(overhead) / 1000, 3),
        },
        "loop_us_per_step": {
            "bare": round(bare_loop / steps * 1e6, 3),
            "with_agent": round(agent_loop / steps * 1e6, 3),
        },
        "sync_wait_overhead_us": {
            "median": round(max(0, statistics.median(with_sync) - base) / 1000, 3)
        },
    }


def bench_commit(settings: Settings, steps: int) -> dict:
    tags = tuple(SampleTag(0, i, i // 16, 0, "w0") for i in range(32))
    batch = Tagged(None, tags)
    with Agent("bench-commit", "w0", settings=settings, listen_for_commands=False) as agent:
        # the sharder client (readers positioned) is made once, before the clock
        _ = agent.committer
        nothing = timed_calls(lambda: agent.untag(batch), steps)
        with_commit = timed_calls(lambda: (agent.untag(batch), agent.step()), steps)
        agent.shard_client.flush(30)
    base = statistics.median(nothing)
    cost = [max(0, s - base) for s in with_commit]
    return {
        "steps": steps,
        "samples_per_step": len(tags),
        "step_with_commit_us": {
            "median": round(statistics.median(cost) / 1000, 3),
            "p99": round(percentile(cost, 0.99) / 1000, 3),
            "mean": round(statistics.fmean(cost) / 1000, 3),
        },
    }


def count_events(settings: Settings, component: str, name: str, job: str) -> int:
    topic = topic_spec(component, name).full_name(settings.topic_prefix)
    partitions = topic_spec(component, name).partitions
    count, idle = 0, 0
    with consuming(settings) as consumer:
        assign_now(
            consumer, [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        while idle < 10:
            batch = [
                m
                for m in poll_batch(consumer, 10_000, 0.1)
                if marker_id(m) is None and m.key() == job.encode()
            ]
            count += len(batch)
            idle = 0 if batch else idle + 1
    return count


def bench_events(settings: Settings, seconds: float) -> dict:
    job = "bench-events"
    with Agent(job, "w0", settings=settings) as agent:
        started = time.monotonic()
        steps = 0
        while time.monotonic() - started < seconds:
            time.sleep(0.001)
            agent.step()
            steps += 1
        elapsed = time.monotonic() - started
        dropped = agent.dropped_events
    metrics = count_events(settings, "worker", "metrics", job)
    lifecycle = count_events(settings, "worker", "lifecycle", job)
    return {
        "seconds": round(elapsed, 2),
        "steps": steps,
        "metrics_events": metrics,
        "metrics_events_per_s": round(metrics / elapsed, 2),
        "lifecycle_events": lifecycle,
        "all_events_per_s": round((metrics + lifecycle) / elapsed, 2),
        "dropped": dropped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--repeat", type=int, default=3, help="overhead runs (median, min and max of their medians)"
    )
    args = parser.parse_args()
    with embedded_broker() as broker:
        settings = fresh_settings(broker)
        runs = [bench_overhead(settings, args.steps) for _ in range(args.repeat)]
        report = {
            "overhead": {
                "runs": runs,
                "step_median_us": spread([r["step_call_overhead_us"]["median"] for r in runs]),
                "step_p99_us": spread([r["step_call_overhead_us"]["p99"] for r in runs]),
                "sync_wait_median_us": spread([r["sync_wait_overhead_us"]["median"] for r in runs]),
            },
            "commit": bench_commit(settings, min(args.steps, 20_000)),
            "events": bench_events(settings, args.seconds),
        }
    print(
        json.dumps(report, indent=2)
        if args.json
        else "\n".join(f"{k}: {v}" for k, v in report.items())
    )


if __name__ == "__main__":
    main()
