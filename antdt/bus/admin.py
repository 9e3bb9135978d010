"""Explicit, idempotent topic creation from the registry.

DESIGN.md: topics are created explicitly, with their configs, at start-up;
never by auto-creation. Creating a topic that exists is not an error; a topic
that exists with fewer partitions than the registry asks for is reported,
because per-key readers compute partitions from the live count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from antdt.errors import BusError
from antdt.settings import Settings
from antdt.topics import TOPICS, TopicSpec

log = logging.getLogger(__name__)


def ensure_topics(
    admin: AdminClient, settings: Settings, specs: Iterable[TopicSpec] = TOPICS, timeout_s: float = 15.0
) -> dict[str, int]:
    """Create the topics that are missing; return ``{name: partition count}`` for all of them."""
    specs = list(specs)
    wanted = {spec.full_name(settings.topic_prefix): spec for spec in specs}
    new_topics = [
        NewTopic(name, num_partitions=spec.partitions, replication_factor=-1, config=dict(spec.configs))
        for name, spec in wanted.items()
    ]
    futures = admin.create_topics(new_topics, operation_timeout=timeout_s, request_timeout=timeout_s)
    for name, future in futures.items():
        _wait_created(name, future, timeout_s)
    return partition_counts(admin, list(wanted), timeout_s, expected={n: s.partitions for n, s in wanted.items()})


def _wait_created(name: str, future, timeout_s: float) -> None:
    try:
        future.result(timeout=timeout_s)
        log.info("created topic %s", name)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise BusError(f"cannot create topic {name}: {error.str()}") from None


def partition_counts(
    admin: AdminClient, names: list[str], timeout_s: float = 10.0, expected: dict[str, int] | None = None
) -> dict[str, int]:
    """Live partition count of each named topic; BusError if one is missing."""
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BusError(f"cannot read cluster metadata: {exc.args[0].str()}") from None
    counts = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            raise BusError(f"topic {name} does not exist")
        counts[name] = len(topic.partitions)
        if expected and counts[name] < expected.get(name, 0):
            log.warning("topic %s has %d partitions, the registry asks for %d", name, counts[name], expected[name])
    return counts
