"""What the embedded broker's stored log costs: broker CPU per fetch against the batches a
partition holds, and whether anything gives the memory back.

Tansu's memory storage keeps one object per produced batch and lists every
object of the partition for each fetch that returns data (and for each
ListOffsets), so the cost of a tailing consumer's fetch grows with the
partition's stored batches, and nothing deletes them: no retention, and
DeleteRecords is not implemented. This measures it on one single-partition
topic, one record per batch:

* for each size in ``--batches``: ``--fetches`` fetches of the partition's last
  record (a seek to high watermark - 1, then a poll), broker CPU per fetch
  (from /proc), repeated ``--repeat`` times: median, min and max; and the
  broker's RSS;
* whether ``DeleteRecords`` trims the partition (it is expected to fail);
* the broker's RSS after the topic is deleted (the one way to free it).

    .venv/bin/python bench/broker_log_bench.py [--batches 1000,5000,20000] [--json]
"""

from __future__ import annotations

import time

import psutil
from benchlib import bench_parser, cpu_seconds, embedded_broker, emit, numbers, spread
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TOPIC = "log-bench"


def fill(producer: Producer, upto: int, produced: int) -> int:
    """Produce single-record batches until ``upto`` are stored."""
    while produced < upto:
        producer.produce(TOPIC, b"x" * 100)
        produced += 1
        producer.flush() if produced % 2000 == 0 else producer.poll(0)
    producer.flush()
    return produced


def cpu_per_fetch_ms(consumer: Consumer, broker: psutil.Process, fetches: int) -> float:
    """Broker CPU per fetch of the partition's last record, ms."""
    _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
    last = TopicPartition(TOPIC, 0, high - 1)
    consumer.assign([last])
    consumer.poll(10)
    began, got = cpu_seconds(broker), 0
    for _ in range(fetches):
        consumer.seek(last)
        message = consumer.poll(10)
        got += message is not None and message.error() is None
    if got < fetches:
        raise RuntimeError(f"only {got} of {fetches} fetches returned the record")
    return 1000 * (cpu_seconds(broker) - began) / fetches


def delete_records(admin: AdminClient, offset: int) -> str:
    """What DeleteRecords answers (the broker's memory storage does not implement it)."""
    try:
        futures = admin.delete_records([TopicPartition(TOPIC, 0, offset)], request_timeout=10)
        for future in futures.values():
            future.result()
    except (KafkaException, AttributeError) as exc:
        return f"failed: {exc}"
    return "trimmed"


def main() -> None:
    parser = bench_parser(__doc__, "fetch")
    parser.add_argument("--batches", default="1000,5000,20000")
    parser.add_argument("--fetches", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(numbers(parser, "--batches", args.batches))
    with embedded_broker() as broker:
        process = psutil.Process(broker.pid)
        # quiet: the DeleteRecords probe drops a connection on purpose
        bootstrap = {"bootstrap.servers": broker.bootstrap_servers, "log_level": 0}
        admin = AdminClient(bootstrap)
        for future in admin.create_topics([NewTopic(TOPIC, 1, 1)]).values():
            future.result()
        producer = Producer({**bootstrap, "linger.ms": 0, "batch.num.messages": 1})
        consumer = Consumer({**bootstrap, "group.id": "log-bench", "enable.auto.commit": False})
        rss_empty = process.memory_info().rss
        points, produced = [], 0
        for size in sizes:
            produced = fill(producer, size, produced)
            per_fetch = [
                cpu_per_fetch_ms(consumer, process, args.fetches) for _ in range(args.repeat)
            ]
            points.append(
                {
                    "batches": size,
                    "broker_cpu_ms_per_fetch": spread(per_fetch, 2),
                    "broker_rss_mb": round(process.memory_info().rss / 2**20, 1),
                }
            )
        trimmed = delete_records(admin, produced // 2)
        consumer.close()
        for future in admin.delete_topics([TOPIC]).values():
            future.result()
        time.sleep(1.0)
        report = {
            "points": points,
            "delete_records": trimmed,
            "broker_rss_mb": {
                "empty": round(rss_empty / 2**20, 1),
                "full": points[-1]["broker_rss_mb"],
                "topic_deleted": round(process.memory_info().rss / 2**20, 1),
            },
            "fetches": args.fetches,
            "repeat": args.repeat,
        }
    emit(report, args.json)


if __name__ == "__main__":
    main()
