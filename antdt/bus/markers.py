"""Markers: how a reader knows it has caught up, without the high watermark.

The embedded broker reports high watermarks wrong (docs/embedded-broker.md), so "read until
the end" is done the way that works everywhere: write a marker record with a
unique id to the partition you read, then read until you see it. Everything
written before the marker has then been read. Markers carry an empty value and
a header; every reader of a topic that may hold markers skips them with
:func:`marker_id`.
"""

from __future__ import annotations

import uuid

from confluent_kafka import Message, Producer

from antdt.bus.clients import flush_or_raise
from antdt.bus.watch import produce_through_reset

MARKER_HEADER = "antdt.marker"


def send_marker(producer: Producer, topic: str, key: bytes, partition: int | None = None) -> str:
    """Queue a marker for the partition of ``key`` (or ``partition``) without waiting; returns its
    id."""
    marker = uuid.uuid4().hex
    where = {} if partition is None else {"partition": partition}
    # a bus reset's missing topic must not end a waiting reader: it waits for the topic instead
    headers = [(MARKER_HEADER, marker.encode())]
    produce_through_reset(producer, None, topic, key=key, value=b"", headers=headers, **where)
    return marker


def write_marker(
    producer: Producer,
    topic: str,
    key: bytes,
    timeout_s: float = 10.0,
    partition: int | None = None,
) -> str:
    """Append a marker to the partition of ``key`` (or to ``partition``) and wait until it is
    written."""
    marker = send_marker(producer, topic, key, partition)
    flush_or_raise(producer, timeout_s)
    return marker


def marker_id(message: Message) -> str | None:
    """The marker id if ``message`` is a marker, else None."""
    for name, value in message.headers() or ():
        if name == MARKER_HEADER:
            return value.decode()
    return None
