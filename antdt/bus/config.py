"""librdkafka client configuration built from :class:`Settings`, in one place.

Every producer, consumer and admin client of every service and of the agent
gets its configuration here, so security settings and the embedded-broker
tuning (see docs/embedded-broker.md: group joins are held for half the session timeout, so
sessions are short and fetch waits low) can never drift between components.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

from antdt.settings import BrokerProfile, Settings

KAFKA_LOG = logging.getLogger("antdt.kafka")

#: Tuning measured against the embedded Tansu broker. Group joins are held
#: for half the session timeout, so sessions are short. A produce does not
#: wake a waiting fetch there, so produce-to-consume latency is about half of
#: fetch.wait.max.ms plus ~2 ms (measured: 20 -> 12 ms p50, 10 -> 7 ms, 5 -> 4 ms).
#: The default wait is also what the sharder's requests and a worker's grants
#: use: grants are asked for a shard ahead, and each training rank's reader
#: polling at 5 ms took broker CPU from the ranks' own steps on a small
#: machine (the user-style job, bench/torchrun_bench.py: about 5 % faster at
#: 25 ms than at 5 ms).
EMBEDDED_CONSUMER = {
    "session.timeout.ms": 2000,
    "heartbeat.interval.ms": 200,
    "fetch.wait.max.ms": 25,
}
#: For the few consumers on a request/reply path whose caller waits on the
#: answer (a parameter server's log, the sharder's recovery) on the embedded
#: broker: ~4 ms per hop, at 200 idle fetches/s. Partial reduce's groups left
#: it: its ranks train on while a group forms (worker/preduce/rounds.py).
EMBEDDED_LOW_LATENCY = {"fetch.wait.max.ms": 5}
#: For followers of topics that change rarely or whose reader acts on a slower
#: clock anyway (control changes, a worker's commands, the monitor's reports, the
#: controller's verdicts). Five idle consumers cost the embedded broker 2.7 % of a
#: core at 100 ms and 1.2-1.5 % at 250 ms, and a record written just after a fetch
#: began was read 38 / 114 ms later (bench/broker_fetch_bench.py); 3-5 % a consumer
#: at the waits above. Under load a fetch returns at once with what came, so the
#: wait shapes latency only while a topic is quiet.
EMBEDDED_BACKGROUND = {"fetch.wait.max.ms": 250}
#: How long librdkafka tries to deliver a record before it reports it failed (every producer's).
MESSAGE_TIMEOUT_MS = 30_000
#: By then every record handed to a producer has been reported delivered or failed: the message
#: timeout, and librdkafka's once-a-second scan for records past it, with a second to spare. A
#: flush that must know each record's fate waits this long; a shorter one took a stall the bus
#: rides out (a Kafka leader election, a starved broker: one commit unacknowledged for 10 s in a
#: CI run) for a lost record.
DELIVERY_BOUND_S = MESSAGE_TIMEOUT_MS / 1000 + 2.0


class FetchPace(str, Enum):
    """How long a consumer's fetch waits on the embedded broker: latency against that broker's CPU
    (on Kafka every pace is :data:`KAFKA_CONSUMER`: a waiting fetch is answered when data
    arrives)."""

    STEADY = "steady"
    LOW_LATENCY = "low-latency"
    BACKGROUND = "background"


EMBEDDED_PACES = {
    FetchPace.STEADY: EMBEDDED_CONSUMER,
    FetchPace.LOW_LATENCY: EMBEDDED_LOW_LATENCY,
    FetchPace.BACKGROUND: EMBEDDED_BACKGROUND,
}
#: The embedded broker forgets everything when it restarts (docs/embedded-broker.md). An
#: idempotent producer then hangs for good (measured: nothing delivered
#: after 15 s, no error), because the broker no longer knows its producer id
#: and sequence numbers; a plain one delivers what it buffered within a second
#: of the topics being back. One request in flight keeps retries in order; a
#: retried duplicate is harmless, every consumer dedupes (seqs, grant ids,
#: command ids). Reconnects back off to 1 s at most, not librdkafka's 10 s.
EMBEDDED_PRODUCER = {"enable.idempotence": False, "max.in.flight.requests.per.connection": 1}
#: A fresh client's first request waits for its second connection: librdkafka drops the bootstrap
#: connection once metadata names the broker, and connects again no sooner than half of
#: ``reconnect.backoff.ms`` later (its 100 ms default: 52 ms of every fresh reader's assign, three
#: of them in a sharder's take-over of a new job; 13 ms at 20 ms, librdkafka's floor being 11).
EMBEDDED_RECONNECT = {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 1000}
#: Production defaults that still keep end-to-end latency low (Kafka answers
#: a waiting fetch as soon as data arrives, so the wait bounds idle polling only).
KAFKA_CONSUMER = {"fetch.wait.max.ms": 100}


def common_config(settings: Settings, client_id: str | None = None) -> dict[str, Any]:
    """Connection, identity and security settings shared by every client."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": client_id or settings.client_id,
        "security.protocol": settings.security_protocol.value,
        "logger": KAFKA_LOG,
        # KIP-714's client metrics, pushed to the broker: nobody here reads them, and every client
        # asked the embedded broker for a subscription about once every 1.7 s (measured idle)
        "enable.metrics.push": False,
    }
    if settings.sasl_mechanism is not None:
        conf["sasl.mechanism"] = settings.sasl_mechanism.value
        conf["sasl.username"] = settings.sasl_username
        conf["sasl.password"] = (
            settings.sasl_password.get_secret_value() if settings.sasl_password else ""
        )
    if settings.tls_ca_path is not None:
        conf["ssl.ca.location"] = str(settings.tls_ca_path)
    if settings.broker_profile is BrokerProfile.EMBEDDED:
        conf.update(EMBEDDED_RECONNECT)
    return conf


def producer_config(settings: Settings, client_id: str | None = None) -> dict[str, Any]:
    """Durable, ordered, murmur2-partitioned producer with a short linger.

    It never creates a topic by asking for it: a metadata request for a
    missing topic would otherwise create it with the broker's default
    partition count (seen after an embedded broker restart), and per-key
    readers compute partitions from the registry's counts.
    """
    embedded = settings.broker_profile is BrokerProfile.EMBEDDED
    return {
        **common_config(settings, client_id),
        "partitioner": "murmur2_random",
        "acks": "all",
        "enable.idempotence": True,
        "allow.auto.create.topics": False,
        "linger.ms": 2 if embedded else 5,
        "message.timeout.ms": MESSAGE_TIMEOUT_MS,
        **(EMBEDDED_PRODUCER if embedded else {}),
    }


def fetch_wait_ms(settings: Settings, pace: FetchPace = FetchPace.STEADY) -> int:
    """The consumer fetch wait for the broker profile (librdkafka and Faust alike)."""
    if settings.broker_profile is not BrokerProfile.EMBEDDED:
        return KAFKA_CONSUMER["fetch.wait.max.ms"]
    return EMBEDDED_PACES[pace]["fetch.wait.max.ms"]


def collected_late(settings: Settings, pace: FetchPace) -> dict[str, Any]:
    """Overrides for a reader of replies that are asked for ahead of need and collected late (a
    worker's shard grants, asked a shard ahead), on the embedded broker: librdkafka stops fetching
    once one record waits unread in its queue, and looks again every fetch wait until it is read
    (no request to the broker), instead of fetching all along while it waits. A reply read adds
    at most one fetch wait before the next fetch. On Kafka none: a waiting fetch costs that broker
    nothing until a record arrives, and its answer comes at once.

    Measured on the user-style job (bench/user_job.py, 2 ranks on 2 cores, the embedded broker,
    librdkafka's statistics): each rank's grant reader sent 28-31 fetches in a run instead of
    164-167 (docs/torchrun.md, "Set-up, the bus and the cores")."""
    if settings.broker_profile is not BrokerProfile.EMBEDDED:
        return {}
    return {"queued.min.messages": 1, "fetch.queue.backoff.ms": fetch_wait_ms(settings, pace)}


def consumer_config(
    settings: Settings,
    group_id: str,
    client_id: str | None = None,
    pace: FetchPace = FetchPace.STEADY,
) -> dict[str, Any]:
    """Consumer with manual commits, reading from the start of unknown partitions."""
    tuning = KAFKA_CONSUMER
    if settings.broker_profile is BrokerProfile.EMBEDDED:
        tuning = {**EMBEDDED_CONSUMER, **EMBEDDED_PACES[pace]}
    return {
        **common_config(settings, client_id),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        **tuning,
    }


def describe_profile(settings: Settings) -> str:
    """One line: the broker profile and the client settings it decides, as the clients get them.

    Every service, worker and the demo print it at start, so a log shows
    which tuning really ran: built by the same functions as the clients, it
    cannot say ``kafka`` while they run ``embedded`` (whose producers are not
    idempotent).
    """
    producer, consumer = producer_config(settings), consumer_config(settings, "-")
    return (
        f"kafka clients: broker profile {settings.broker_profile.value}, "
        f"enable.idempotence={str(producer['enable.idempotence']).lower()}, "
        f"session.timeout.ms={consumer.get('session.timeout.ms', 'default')}, "
        f"fetch.wait.max.ms={consumer['fetch.wait.max.ms']}"
    )


def admin_config(settings: Settings, client_id: str | None = None) -> dict[str, Any]:
    """Admin client configuration."""
    return common_config(settings, client_id)
