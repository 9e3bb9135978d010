"""Controller figures: decision latency, verdict written -> command read from the commands topic.

    .venv/bin/python bench/controller_bench.py [--json] [--verdicts 1000] [--policy antdt-nd]

``antdt controller`` runs as its own process on the embedded broker. One
verdict at a time (a TRANSIENT straggler on a new worker, so the AntDT-ND
policy answers each with one SET_SHARD_QUOTA command, signed) is written to
``monitor.verdicts``; the time until its command is read back from
``controller.commands`` is one sample. Both clients use the production
client settings of the embedded profile.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from benchlib import bench_parser, distribution, embedded_broker, emit, fresh_settings
from confluent_kafka import OFFSET_END, TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.readers import assign_now, poll_batch
from antdt.runtime.launch import service_process
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import StragglerClass, StragglerVerdict, VerdictKind, VerdictWindow
from antdt.settings import load_settings
from antdt.topics import topic_spec

CODEC = SingleObjectCodec()


def a_verdict(i: int) -> StragglerVerdict:
    now = datetime.now(UTC)
    return StragglerVerdict(
        verdict_id=f"bench-{i}-{time.time_ns()}",
        job_id=f"job-{i % 50}",
        worker_id=f"w{i}",
        node_id=f"node-{i}",
        kind=VerdictKind.STRAGGLER,
        classification=StragglerClass.TRANSIENT,
        relative_score=5.0,
        individual_score=2.0,
        speed_ratio=2.0,
        window=VerdictWindow(start=now, end=now, reports=10),
        episode_start=now,
        evidence=[],
        issued_at=now,
    )


def bench_latency(count: int, policy: str) -> dict:
    with embedded_broker() as broker:
        settings = fresh_settings(broker)
        settings = load_settings(
            **{**settings.model_dump(), "signing_key": "bench-signing-key-0123456789abcdef"}
        )
        with service_process(
            settings,
            "controller",
            "--set",
            f"policy={policy}",
            "--set",
            "max_commands_per_minute=100000",
        ) as controller:
            controller.wait_ready()
            topic = settings.topic("controller", "commands")
            consumer = make_consumer(settings, pace=FetchPace.LOW_LATENCY)
            assign_now(
                consumer,
                [
                    TopicPartition(topic, p, OFFSET_END)
                    for p in range(topic_spec("controller", "commands").partitions)
                ],
            )
            producer = make_producer(settings, **{"linger.ms": 0})
            samples, unanswered = [], 0
            for i in range(count):
                verdict = a_verdict(i)
                began = time.perf_counter()
                producer.produce(
                    settings.topic("monitor", "verdicts"),
                    key=verdict.job_id.encode(),
                    value=CODEC.encode(verdict),
                )
                producer.poll(0)
                if _await_command(consumer, verdict.verdict_id, timeout_s=5.0):
                    samples.append((time.perf_counter() - began) * 1000)
                else:
                    unanswered += 1
            producer.flush(5)
            consumer.close()
            commands = controller.metric(
                'antdt_controller_commands_total{action="SET_SHARD_QUOTA",dry_run="false"}'
            )
    return {
        "verdicts": count,
        "answered": len(samples),
        "unanswered": unanswered,
        "commands": int(commands),
        "latency_ms": distribution(samples, digits=2),
    }


def _await_command(consumer, verdict_id: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in poll_batch(consumer, 100, 0.05):
            if CODEC.decode(message.value()).verdict_id == verdict_id:
                return True
    return False


def main() -> None:
    parser = bench_parser(__doc__, "latency")
    parser.add_argument("--verdicts", type=int, default=1000)
    parser.add_argument("--policy", default="antdt-nd")
    args = parser.parse_args()
    emit({"latency": bench_latency(args.verdicts, args.policy)}, args.json)


if __name__ == "__main__":
    main()
