"""Factories for the Kafka clients every service and the agent use.

Nothing else in antdt constructs a ``confluent_kafka`` client: the defaults
(:mod:`antdt.bus.config`) live in one place. Overrides are for the rare
caller that needs one knob changed, e.g. a bounded queue in the agent.

Every client gets an :class:`ErrorWatch` as its error callback, so a refused
login is noticed (librdkafka itself would retry it for ever); the admin
client carries its watch as ``error_watch`` for
:func:`antdt.bus.admin.cluster_metadata` to turn into one
:class:`~antdt.errors.AuthenticationError`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from antdt.bus.closing import BoundedConsumer
from antdt.bus.config import (
    KAFKA_LOG,
    FetchPace,
    admin_config,
    consumer_config,
    producer_config,
)
from antdt.bus.gaps import GuardedConsumer
from antdt.errors import AuthenticationError, BusError
from antdt.settings import BrokerProfile, Settings

log = logging.getLogger(__name__)

#: A client that keeps failing to log in or connect says so again (with the count) this often.
AUTH_REMINDER_S = 30.0
_BROKER_PREFIX = re.compile(r"^\S+://\S+: (SASL authentication error: )?")
#: librdkafka's tail on a connection line: how long the connection lasted and in which state, and
#: how many identical lines it held back itself (``..., 3 identical error(s) suppressed``).
_STATE_SUFFIX = re.compile(
    r" \(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)$"
)


def describe_auth_failure(settings: Settings, error: KafkaError) -> str:
    """One line: who was refused, by which mechanism, where, and the broker's reason."""
    reason = _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", error.str()))
    mechanism = (
        settings.sasl_mechanism.value
        if settings.sasl_mechanism
        else settings.security_protocol.value
    )
    return (
        f"authentication failed for user {settings.sasl_username!r} ({mechanism}) on "
        f"{settings.bootstrap_servers}: {reason}"
    )


class ErrorWatch:
    """librdkafka's ``error_cb`` for antdt's clients: remembers a refused login.

    librdkafka never gives up on a refused login: it reconnects and tries
    again for as long as the client lives (measured against the embedded
    broker: a consumer about 20 times a second, a producer about 3). This
    callback keeps the failure for the caller waiting on the client to raise
    (:meth:`raise_if_refused`), logs it once and then a reminder with the
    count every :data:`AUTH_REMINDER_S`. Other errors only at DEBUG: without
    a callback librdkafka drops them too (its own log lines already say
    what failed).
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.refusal: KafkaError | None = None
        self.refusals = 0
        self._logged_at = float("-inf")

    def __call__(self, error: KafkaError) -> None:
        if error.code() != KafkaError._AUTHENTICATION:
            KAFKA_LOG.debug("%s", error.str())
            return
        self.refusal, self.refusals = error, self.refusals + 1
        if time.monotonic() - self._logged_at >= AUTH_REMINDER_S:
            self._logged_at = time.monotonic()
            KAFKA_LOG.error(
                "%s (refused %d time(s) so far)",
                describe_auth_failure(self.settings, error),
                self.refusals,
            )

    def raise_if_refused(self) -> None:
        if self.refusal is not None:
            raise AuthenticationError(describe_auth_failure(self.settings, self.refusal))


class RepeatedFailures(logging.Filter):
    """Lets each of librdkafka's lines for a failure that repeats through once per
    :data:`AUTH_REMINDER_S` per client and broker, the next one with how many were held back.

    librdkafka logs every attempt itself: a refused login (the :class:`ErrorWatch` keeps its
    count) and a connection refused, timed out or not resolved. An agent started before its bus
    (no ``antdt up``, or its address not exported) printed the same line about 20 times a
    second per rank until its look at the bus gave up (:func:`antdt.bus.admin.cluster_metadata`,
    which says once what it waits for and why).
    """

    REPEATING = (
        "SASL authentication error",
        "mechanism handshake failed",
        "failed: Connection refused",
        "failed: Connection timed out",
        "Failed to resolve",
    )

    def __init__(self):
        super().__init__()
        self._shown_at: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not any(failure in text for failure in self.REPEATING):
            return True
        key, now = _STATE_SUFFIX.sub("", text), time.monotonic()
        if now - self._shown_at.get(key, float("-inf")) < AUTH_REMINDER_S:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._shown_at[key] = now
        held = self._held.pop(key, 0)
        if held:
            record.msg, record.args = f"{text} (and {held} time(s) since it was last shown)", ()
        return True


def not_a_cluster_id_change(record: logging.LogRecord) -> bool:
    """Drops librdkafka's warning that the cluster id changed: :mod:`antdt.bus.watch` reports that
    reset itself, once."""
    return "reports different ClusterId" not in record.getMessage()


KAFKA_LOG.addFilter(RepeatedFailures())
KAFKA_LOG.addFilter(not_a_cluster_id_change)


def _with_watch(settings: Settings, conf: dict[str, Any]) -> dict[str, Any]:
    return conf if "error_cb" in conf else {**conf, "error_cb": ErrorWatch(settings)}


DeliveryReport = Callable[[KafkaError | None, Any], None]


class CountingProducer(Producer):
    """A producer that counts its own records in flight (:attr:`in_flight`).

    librdkafka's length (``len(producer)``, what ``flush()`` returns) counts
    its queued requests and events as well as records: a stopped broker's one
    undelivered record read 5 in CI. A record counts from ``produce`` until its
    delivery is reported (acknowledged, failed or purged), in whichever thread
    polls; the caller's own report (``on_delivery``) runs after the count has
    dropped. Counting costs about 2.7 us a record (4.5 against 1.8 us for a
    ``produce`` on this 2-core machine).
    """

    def __init__(self, conf: dict[str, Any]):
        super().__init__(conf)
        self._in_flight = 0
        self._count_lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Records handed over and not yet reported delivered, failed or purged."""
        return self._in_flight

    def undelivered_after_flush(self, timeout_s: float) -> int:
        """Flush (at most ``timeout_s``); the records still undelivered then."""
        self.flush(timeout_s)
        return self._in_flight

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        on_delivery: DeliveryReport | None = None,
        **record: Any,
    ) -> None:
        with self._count_lock:  # counted first: another thread's poll may report it delivered
            self._in_flight += 1
        report = self._count_down if on_delivery is None else partial(self._reported, on_delivery)
        try:
            super().produce(topic, value, key, on_delivery=report, **record)
        except BaseException:
            self._count_down()
            raise

    def _reported(self, report: DeliveryReport, error: KafkaError | None, message) -> None:
        self._count_down()
        report(error, message)

    def _count_down(self, *_report: Any) -> None:
        with self._count_lock:
            self._in_flight -= 1


def make_producer(
    settings: Settings, client_id: str | None = None, **overrides: Any
) -> CountingProducer:
    """An ``acks=all``, murmur2-partitioned producer (idempotent on Kafka; see
    :mod:`antdt.bus.config`) that counts its records in flight."""
    return CountingProducer(
        _with_watch(settings, {**producer_config(settings, client_id), **overrides})
    )


def make_consumer(
    settings: Settings,
    group_id: str | None = None,
    client_id: str | None = None,
    pace: FetchPace = FetchPace.STEADY,
    **overrides: Any,
) -> Consumer:
    """A consumer with manual commits; without a group id it gets a private one (for assign()).

    On the embedded broker the fetch wait bounds latency, and every idle
    fetch costs that broker CPU: ``pace`` (:class:`FetchPace`) shortens it for
    request/reply paths and lengthens it for followers of topics that rarely
    change or answers asked for ahead of need. There it also reads through a gap guard
    (:mod:`antdt.bus.gaps`): that broker can let a tailing reader skip an offset.
    """
    group = group_id or f"{settings.topic_prefix}.reader.{uuid.uuid4().hex[:12]}"
    conf = _with_watch(
        settings,
        {**consumer_config(settings, group, client_id, pace), **overrides},
    )
    return (
        GuardedConsumer(conf)
        if settings.broker_profile is BrokerProfile.EMBEDDED
        else BoundedConsumer(conf)
    )


def make_admin(settings: Settings, client_id: str | None = None, **overrides: Any) -> AdminClient:
    """An admin client; ``error_watch`` is its :class:`ErrorWatch` (None with an ``error_cb``
    override)."""
    conf = _with_watch(settings, {**admin_config(settings, client_id), **overrides})
    admin = AdminClient(conf)
    admin.error_watch = conf["error_cb"] if isinstance(conf["error_cb"], ErrorWatch) else None
    return admin


def flush_or_raise(producer: CountingProducer, timeout_s: float = 10.0) -> None:
    """Flush, and raise BusError if a record is still undelivered after ``timeout_s``."""
    if remaining := producer.undelivered_after_flush(timeout_s):
        raise BusError(f"{remaining} record(s) still undelivered after {timeout_s:g} s")


def drain(producer: CountingProducer, timeout_s: float = 10.0) -> int:
    """Flush on shutdown; log (never raise) the records still undelivered. Returns their count."""
    if remaining := producer.undelivered_after_flush(timeout_s):
        log.warning("shutdown: %d record(s) undelivered after %g s", remaining, timeout_s)
    return remaining


@contextmanager
def producing(
    settings: Settings,
    client_id: str | None = None,
    flush_timeout_s: float = 10.0,
    **overrides: Any,
) -> Iterator[CountingProducer]:
    """A producer that is flushed on the way out (graceful shutdown loses nothing)."""
    producer = make_producer(settings, client_id, **overrides)
    try:
        yield producer
    finally:
        drain(producer, flush_timeout_s)


@contextmanager
def consuming(
    settings: Settings, group_id: str | None = None, client_id: str | None = None, **overrides: Any
) -> Iterator[Consumer]:
    """A consumer that is closed on the way out (leaves its group promptly)."""
    consumer = make_consumer(settings, group_id, client_id, **overrides)
    try:
        yield consumer
    finally:
        consumer.close()
