"""The dead-letter topic: where records that cannot be used go, with provenance.

A record that does not decode or does not validate is never dropped silently
and never stops a service: it is copied, key, value and original headers, to
``<prefix>.deadletter`` with headers saying where it came from and why it
failed, and counted. A bus reset (a broker restarted empty, the embedded
broker's roll) takes the topic away for a moment: a dead letter the producer
refuses for that waits, bounded, until the topic is back, instead of ending
the service that sends it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from antdt.bus.watch import TOPICS_BACK_WITHIN_S, produce_through_reset
from antdt.settings import Settings
from antdt.topics import topic_spec

log = logging.getLogger(__name__)

HEADER_TOPIC = "antdt.source.topic"
HEADER_PARTITION = "antdt.source.partition"
HEADER_OFFSET = "antdt.source.offset"
HEADER_ERROR = "antdt.error"
HEADER_ERROR_TYPE = "antdt.error.type"
HEADER_SERVICE = "antdt.service"
HEADER_FAILED_AT = "antdt.failed.at"
HEADER_VALUE_DROPPED = "antdt.value.dropped"


@dataclass(frozen=True)
class SourceRecord:
    """A consumed record as the dead-letter topic needs it (from any client library)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def from_confluent(cls, message) -> SourceRecord:
        """Adapt a ``confluent_kafka.Message``."""
        return cls(
            message.topic(),
            message.partition(),
            message.offset(),
            message.key(),
            message.value(),
            tuple(message.headers() or ()),
        )

    @classmethod
    def from_faust(cls, message: Any) -> SourceRecord:
        """Adapt a Faust ``Message`` (headers come as a list of pairs or a mapping)."""
        headers = message.headers or ()
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        return cls(
            message.topic,
            message.partition,
            message.offset,
            message.key,
            message.value,
            tuple(pairs),
        )


class RecordSink(Protocol):
    """What the dead-letter topic is written through: a confluent ``Producer`` or an adapter."""

    def produce(
        self, topic: str, key: bytes | None = None, value: bytes | None = None, headers: Any = None
    ) -> None: ...

    def poll(self, timeout: float = 0) -> int: ...


class Tally(Protocol):
    """A counter the dead letters are also counted in, e.g. a Prometheus ``Counter``."""

    def inc(self, amount: float = 1) -> None: ...


class DeadLetter:
    """Publishes failed records to the dead-letter topic and counts them.

    ``counter`` is the service's own metric (``antdt_<service>_deadlettered_total``):
    counting here, where the record is sent, means no path can send without
    counting or count without sending.
    """

    def __init__(
        self,
        producer: RecordSink,
        topic: str,
        service: str,
        counter: Tally | None = None,
        topic_back_within_s: float = TOPICS_BACK_WITHIN_S,
    ):
        self._producer = producer
        self.topic = topic
        self.topic_back_within_s = topic_back_within_s
        self.service = service
        self.count = 0
        self._counter = counter

    def send(self, record: SourceRecord, error: BaseException | str) -> None:
        """Copy ``record`` to the dead-letter topic with provenance headers."""
        message = str(error) if isinstance(error, BaseException) else error
        kind = type(error).__name__ if isinstance(error, BaseException) else "Error"
        headers = [
            *record.headers,
            (HEADER_TOPIC, record.topic.encode()),
            (HEADER_PARTITION, str(record.partition).encode()),
            (HEADER_OFFSET, str(record.offset).encode()),
            (HEADER_ERROR, message.encode()[:4096]),
            (HEADER_ERROR_TYPE, kind.encode()),
            (HEADER_SERVICE, self.service.encode()),
            (HEADER_FAILED_AT, datetime.now(UTC).isoformat().encode()),
        ]
        self._produce(record, headers)
        self._producer.poll(0)
        self.count += 1
        if self._counter is not None:
            self._counter.inc()
        log.warning(
            "dead-lettered %s[%d]@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            message,
            extra={"service": self.service},
        )

    @classmethod
    def for_settings(
        cls, sink: RecordSink, settings: Settings, service: str, counter: Tally | None = None
    ) -> DeadLetter:
        """The dead-letter writer of ``service``, on the dead-letter topic under ``settings``'
        prefix."""
        return cls(
            sink, topic_spec("", "deadletter").full_name(settings.topic_prefix), service, counter
        )

    def _produce(self, record: SourceRecord, headers: list[tuple[str, bytes]]) -> None:
        """Copy the record; one too large to copy with its headers goes without its value.

        A record just under the source topic's size limit no longer fits once
        the provenance headers are added. Failing here would stop the service
        on every redelivery of that record, so the provenance is kept and the
        value (still in the source topic, at the offset named) is left out.
        """
        try:
            self._write(key=record.key, value=record.value, headers=headers)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            size = str(len(record.value or b"")).encode()
            self._write(
                key=record.key, value=None, headers=[*headers, (HEADER_VALUE_DROPPED, size)]
            )

    def _write(self, **record) -> None:
        """One dead letter; one a bus reset's missing topic refuses waits until the topic is back
        (at most ``topic_back_within_s``, then TopicMissing) instead of ending the service: the
        sharder once ended on such a refusal of an answer, holding the only copy of its state."""
        produce_through_reset(
            self._producer, None, self.topic, within_s=self.topic_back_within_s, **record
        )
