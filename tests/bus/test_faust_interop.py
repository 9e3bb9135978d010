"""Avro messages cross between confluent-kafka and a Faust agent in both directions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import consuming, producing
from antdt.bus.readers import poll_batch
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.examples import worker_metrics
from antdt.schemas.models import AckStatus, CommandAck
from antdt.topics import topic_spec

APP = Path(__file__).with_name("faust_echo_app.py")


@pytest.fixture
def faust_echo(settings, topics, tmp_path):
    env = {
        **os.environ,
        "ANTDT_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "ANTDT_BROKER_PROFILE": "embedded",
        "ANTDT_TOPIC_PREFIX": settings.topic_prefix,
        "PYTHONUNBUFFERED": "1",
    }
    log = (tmp_path / "faust.log").open("w+")
    process = subprocess.Popen(
        [sys.executable, str(APP)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
    )
    yield process, log
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the Faust worker did not stop within 15 s of SIGTERM")
    log.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_confluent_to_faust_and_back(settings, topics, faust_echo):
    process, log = faust_echo
    codec = SingleObjectCodec()
    metrics_topic = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    acks_topic = topic_spec("worker", "acks").full_name(settings.topic_prefix)
    sent = [worker_metrics(seq=s) for s in range(5)]
    with producing(settings) as producer:
        for message in sent:
            producer.produce(
                metrics_topic, key=message.job_id.encode(), value=codec.encode(message)
            )

    answers: dict[str, CommandAck] = {}
    with consuming(settings) as consumer:
        consumer.assign(
            [TopicPartition(acks_topic, p, OFFSET_BEGINNING) for p in range(topics[acks_topic])]
        )
        deadline = time.monotonic() + 60
        while len(answers) < len(sent) and time.monotonic() < deadline and process.poll() is None:
            for message in poll_batch(consumer, 100, 0.5):
                ack = codec.decode(message.value())
                answers[ack.command_id] = ack
    log.seek(0)
    assert len(answers) == len(sent), (
        f"Faust answered {len(answers)} of {len(sent)}; log:\n{log.read()[-3000:]}"
    )
    for message in sent:
        ack = answers[f"ack-{message.seq}"]
        assert isinstance(ack, CommandAck) and ack.status is AckStatus.APPLIED
        assert ack.reason == f"samples={message.samples}"
        assert ack.applied_step == message.last_step and ack.timestamp == message.window_end
