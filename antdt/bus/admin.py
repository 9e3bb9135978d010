"""Explicit, idempotent topic creation from the registry.

docs/embedded-broker.md: topics are created explicitly, with their configs, at start-up;
never by auto-creation. Creating a topic that exists is not an error; a topic
that exists with fewer partitions than the registry asks for is reported,
because per-key readers compute partitions from the live count.

Every service creates its topics first thing, and the agent looks up partition
counts before its first request, so :func:`cluster_metadata` is where a
process learns that the broker is unreachable or refuses its credentials,
and stops with one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from antdt.bus.clients import make_admin
from antdt.embedded.broker import accepts_connections
from antdt.errors import BusError, BusUnreachable, TopicMissing
from antdt.settings import SecurityProtocol, Settings
from antdt.topics import TOPICS, TopicSpec

log = logging.getLogger(__name__)

#: How long the first metadata request may wait before the error callback is looked at; each next
#: one waits twice as long, up to the last (a far broker's round trip may exceed the first).
METADATA_SLICES_S = (0.2, 2.0)
#: A process still waiting for its bus after this long says once what it waits for, and why
#: (a broker starting beside it answers well within it).
SAY_WAITING_AFTER_S = 1.0


def cluster_metadata(
    admin: AdminClient, settings: Settings | None = None, timeout_s: float = 10.0
) -> ClusterMetadata:
    """The cluster's metadata; AuthenticationError as soon as a login is refused, BusError at the
    deadline.

    librdkafka reports a refused login only to the error callback (served by
    ``poll``) and meanwhile retries it, while ``list_topics`` would wait out
    its whole timeout; so wait in growing slices and look in between.
    """
    watch = getattr(admin, "error_watch", None)
    settings = settings or (watch.settings if watch is not None else None)
    began = time.monotonic()
    deadline, said_so = began + timeout_s, False
    wait_s, longest_s = METADATA_SLICES_S
    while True:
        slice_s = max(min(wait_s, deadline - time.monotonic()), 0.01)
        started = time.monotonic()
        try:
            return admin.list_topics(timeout=slice_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
        admin.poll(0)
        if watch is not None:
            watch.raise_if_refused()
        if time.monotonic() >= deadline:
            raise BusUnreachable(_unreachable(settings, error, timeout_s))
        if not said_so and settings is not None and time.monotonic() - began >= SAY_WAITING_AFTER_S:
            said_so = True
            log.warning("%s", _waiting(settings, timeout_s))
        time.sleep(max(slice_s - (time.monotonic() - started), 0))
        wait_s = min(wait_s * 2, longest_s)


def look_at_bus(settings: Settings, timeout_s: float = 15.0) -> ClusterMetadata:
    """One look at the bus before a process makes its other clients: each client retries a refused
    login on its own until the refusal surfaces, so a process that looks first stops on a wrong
    password after one client's attempts, not after every client's (a listening agent made 41-51
    without it, 16 with it). AuthenticationError or BusUnreachable as :func:`cluster_metadata`."""
    return cluster_metadata(make_admin(settings), settings, timeout_s)


def _unreachable(settings: Settings | None, error: KafkaError, timeout_s: float) -> str:
    """Why metadata did not come, with what to check (:func:`_hint`)."""
    where = f" from {settings.bootstrap_servers}" if settings else ""
    message = f"cannot read cluster metadata{where} within {timeout_s:.0f} s: {error.str()}"
    hint = _hint(settings) if settings else None
    return f"{message} ({hint})" if hint else message


def _waiting(settings: Settings, timeout_s: float) -> str:
    """The one line a process waiting for its bus logs (librdkafka's own lines for each failed
    connection are held back: :class:`antdt.bus.clients.RepeatedFailures`)."""
    hint = _hint(settings) or f"nothing answers at {settings.bootstrap_servers} yet"
    return f"waiting up to {timeout_s:.0f} s for the bus: {hint}"


def _hint(settings: Settings) -> str | None:
    """What to check: nothing listening at the address (no ``antdt up``, or its address not
    exported), or a plaintext client at a broker that closes its connections (it wants a login)."""
    accepts = _any_accepts(settings.bootstrap_servers)
    if not accepts:
        return (
            f"nothing accepts connections at {settings.bootstrap_servers}: start the bus "
            "(`antdt up` prints the ANTDT_BOOTSTRAP_SERVERS to export) or set "
            "ANTDT_BOOTSTRAP_SERVERS to your Kafka's address"
        )
    if settings.security_protocol is SecurityProtocol.PLAINTEXT:
        return (
            f"a broker at {settings.bootstrap_servers} accepts connections but closes them: if it"
            " requires authentication, set"
            " ANTDT_SECURITY_PROTOCOL=SASL_PLAINTEXT and ANTDT_SASL_MECHANISM, ANTDT_SASL_USERNAME,"
            " ANTDT_SASL_PASSWORD"
        )
    return None


def _any_accepts(bootstrap_servers: str) -> bool:
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if accepts_connections(host, int(port)):
            return True
    return False


def ensure_topics(
    admin: AdminClient,
    settings: Settings,
    specs: Iterable[TopicSpec] = TOPICS,
    timeout_s: float = 15.0,
) -> dict[str, int]:
    """Create the topics that are missing; return ``{name: partition count}`` for all of them.

    Raises AuthenticationError at once when the broker refuses the credentials.
    """
    specs = list(specs)
    cluster_metadata(admin, settings, timeout_s)
    wanted = {spec.full_name(settings.topic_prefix): spec for spec in specs}
    new_topics = [
        NewTopic(
            name, num_partitions=spec.partitions, replication_factor=-1, config=dict(spec.configs)
        )
        for name, spec in wanted.items()
    ]
    futures = admin.create_topics(
        new_topics, operation_timeout=timeout_s, request_timeout=timeout_s
    )
    for name, future in futures.items():
        _wait_created(name, future, timeout_s)
    return partition_counts(
        admin,
        list(wanted),
        timeout_s,
        expected={n: s.partitions for n, s in wanted.items()},
        settings=settings,
    )


def _wait_created(name: str, future, timeout_s: float) -> None:
    try:
        future.result(timeout=timeout_s)
        log.info("created topic %s", name)
    except TimeoutError:
        raise BusError(f"topic {name} was not created within {timeout_s:g} s") from None
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise BusError(f"cannot create topic {name}: {error.str()}") from None


def partition_counts(
    admin: AdminClient,
    names: list[str],
    timeout_s: float = 10.0,
    expected: dict[str, int] | None = None,
    settings: Settings | None = None,
) -> dict[str, int]:
    """Live partition count of each named topic; BusError if one is missing."""
    metadata = cluster_metadata(admin, settings, timeout_s)
    counts = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            raise TopicMissing(f"topic {name} does not exist")
        counts[name] = len(topic.partitions)
        if expected and counts[name] < expected.get(name, 0):
            log.warning(
                "topic %s has %d partitions, the registry asks for %d",
                name,
                counts[name],
                expected[name],
            )
    return counts
