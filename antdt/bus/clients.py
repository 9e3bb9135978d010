"""Factories for the Kafka clients every service and the agent use.

Nothing else in antdt constructs a ``confluent_kafka`` client: the defaults
(:mod:`antdt.bus.config`) live in one place. Overrides are for the rare
caller that needs one knob changed, e.g. a bounded queue in the agent.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from antdt.bus.config import admin_config, consumer_config, producer_config
from antdt.errors import BusError
from antdt.settings import Settings

log = logging.getLogger(__name__)


def make_producer(settings: Settings, client_id: str | None = None, **overrides: Any) -> Producer:
    """An idempotent, ``acks=all``, murmur2-partitioned producer."""
    return Producer({**producer_config(settings, client_id), **overrides})


def make_consumer(
    settings: Settings, group_id: str | None = None, client_id: str | None = None, low_latency: bool = False,
    **overrides: Any,
) -> Consumer:
    """A consumer with manual commits; without a group id it gets a private one (for assign()).

    ``low_latency`` is for request/reply paths: on the embedded broker it
    shortens the fetch wait, which bounds latency there.
    """
    group = group_id or f"{settings.topic_prefix}.reader.{uuid.uuid4().hex[:12]}"
    return Consumer({**consumer_config(settings, group, client_id, low_latency), **overrides})


def make_admin(settings: Settings, client_id: str | None = None, **overrides: Any) -> AdminClient:
    """An admin client."""
    return AdminClient({**admin_config(settings, client_id), **overrides})


def flush_or_raise(producer: Producer, timeout_s: float = 10.0) -> None:
    """Flush, and raise BusError if anything is still undelivered after ``timeout_s``."""
    remaining = producer.flush(timeout_s)
    if remaining:
        raise BusError(f"{remaining} message(s) still undelivered after {timeout_s:.0f} s")


def drain(producer: Producer, timeout_s: float = 10.0) -> int:
    """Flush on shutdown; log (never raise) what is still undelivered. Returns that count."""
    remaining = producer.flush(timeout_s)
    if remaining:
        log.warning("shutdown: %d message(s) undelivered after %.0f s", remaining, timeout_s)
    return remaining


@contextmanager
def producing(settings: Settings, client_id: str | None = None, flush_timeout_s: float = 10.0, **overrides: Any) -> Iterator[Producer]:
    """A producer that is flushed on the way out (graceful shutdown loses nothing)."""
    producer = make_producer(settings, client_id, **overrides)
    try:
        yield producer
    finally:
        drain(producer, flush_timeout_s)


@contextmanager
def consuming(settings: Settings, group_id: str | None = None, client_id: str | None = None, **overrides: Any) -> Iterator[Consumer]:
    """A consumer that is closed on the way out (leaves its group promptly)."""
    consumer = make_consumer(settings, group_id, client_id, **overrides)
    try:
        yield consumer
    finally:
        consumer.close()
