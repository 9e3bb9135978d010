"""Forged commands: injected straight onto the commands topic, each is refused, acknowledged as such
and counted.

The forger holds no signing key (or a wrong one) but can write to the
topic with any Kafka client: here a plain ``confluent_kafka.Producer`` (no
antdt settings; antdt's :class:`CountingProducer` subclass only counts
its deliveries), keyed ``<job>/<worker>`` and murmur2-partitioned as the controller does, so
every record lands on the agent's partition. A real :class:`Agent` with a
signing key reads them. After the forgeries a valid command must still be
applied: refusing never blocks the channel.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

import pytest

from antdt.bus.clients import CountingProducer
from antdt.control.signing import sign
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import AckStatus, CommandAction, MitigationCommand
from antdt.schemas.types import utc_now
from antdt.topics import worker_key
from antdt.worker import Agent
from tests.reliability.agents import signed_settings, step_until
from tests.reliability.bus import read_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = b"forged-commands-test-signing-key-0123"
FORGER_KEY = b"not-the-controller-key-not-the-key!!"
CODEC = SingleObjectCodec()
JOB, WORKER = "job-f", "w1"


def unsigned(quota: int, **fields) -> MitigationCommand:
    """A SET_SHARD_QUOTA command for our worker, valid for five minutes, from controller epoch 2."""
    now = utc_now()
    values = dict(
        command_id=f"c-{time.time_ns()}",
        job_id=JOB,
        target_worker=WORKER,
        action=CommandAction.SET_SHARD_QUOTA,
        shard_quota=quota,
        reason="forged?",
        evidence=[],
        policy="antdt-nd",
        issued_at=now,
        expires_at=now + timedelta(minutes=5),
        controller_epoch=2,
    )
    return MitigationCommand(**{**values, **fields})


def forgeries(applied: MitigationCommand) -> list[tuple[str, MitigationCommand]]:
    """(reason the agent must give, command) for each kind of forgery."""
    now = utc_now()
    return [
        ("bad signature", sign(unsigned(11), FORGER_KEY)),
        # tampered after signing
        ("bad signature", sign(unsigned(12), KEY).model_copy(update={"shard_quota": 64})),
        ("bad signature", unsigned(13, signature=b"\x00" * 32)),
        ("stale epoch", sign(unsigned(14, controller_epoch=1), KEY)),
        (
            "expired",
            sign(
                unsigned(
                    15, issued_at=now - timedelta(minutes=2), expires_at=now - timedelta(seconds=1)
                ),
                KEY,
            ),
        ),
        ("duplicate", applied),  # replayed, byte for byte
        ("unsigned", unsigned(16)),
        # must not raise the epoch the agent trusts
        ("unsigned", unsigned(17, controller_epoch=99)),
        ("wrong target", sign(unsigned(18, target_worker="w2"), KEY)),
        ("wrong target", sign(unsigned(19, job_id="job-other"), KEY)),
    ]


def inject(settings, commands: list[MitigationCommand]) -> None:
    """Write commands to our worker's key with a plain client, as anyone with access to the topic
    could."""
    producer = CountingProducer(
        {"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    for command in commands:
        producer.produce(
            settings.topic("controller", "commands"),
            key=worker_key(JOB, WORKER).encode(),
            value=CODEC.encode(command),
        )
    assert producer.undelivered_after_flush(10) == 0


def acks(settings, topics, want: int) -> list:
    topic = settings.topic("worker", "acks")
    found = read_until(settings, topic, topics[topic], lambda ms: len(ms) >= want)
    return [CODEC.decode(m.value()) for m in found]


def test_forged_commands_are_rejected_counted_and_do_not_block_a_valid_one(settings, topics):
    signed = signed_settings(settings, KEY)
    with Agent(JOB, WORKER, settings=signed, shard_quota=2) as agent:
        first = sign(unsigned(3), KEY)
        inject(signed, [first])
        # epoch 2 is now the highest the agent has seen
        step_until(agent, lambda: agent.shard_quota == 3)

        forged = forgeries(first)
        after = sign(unsigned(7), KEY)
        inject(signed, [command for _, command in forged] + [after])
        step_until(agent, lambda: agent.shard_quota == 7)
        assert agent.verifier.highest_epoch == 2
        rejected = Counter(agent.verifier.rejected)
    assert rejected == Counter(reason for reason, _ in forged)

    answers = acks(signed, topics, want=len(forged) + 2)
    applied = [a.command_id for a in answers if a.status is AckStatus.APPLIED]
    assert applied == [first.command_id, after.command_id]
    refusals = [(a.command_id, a.reason) for a in answers if a.status is AckStatus.REJECTED]
    assert len(refusals) == len(forged)
    for (reason, command), (acked_id, acked_reason) in zip(forged, refusals):
        assert acked_id == command.command_id and acked_reason.startswith(reason)
    print("forged commands rejected:", dict(rejected))
