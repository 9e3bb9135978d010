"""A producer that refuses records as librdkafka refuses one for a topic a bus reset took (the
producer's metadata saw the topic gone before a watch made it again): what a broker roll does to a
writer at a moment no test can time."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Message


class RefusingProducer:
    """Wraps a real producer; its first ``times`` ``produce`` calls raise ``_UNKNOWN_TOPIC``
    (after calling ``before_refusing``, e.g. a broker's restart: the refusal a real roll causes),
    everything else is the real producer's."""

    def __init__(
        self, producer, times: int = 1, before_refusing: Callable[[], object] | None = None
    ):
        self._producer = producer
        self._times = times
        self._before_refusing = before_refusing
        self.refused = 0

    def produce(self, *args, **kwargs):
        if self.refused < self._times:
            self.refused += 1
            if self._before_refusing is not None:
                self._before_refusing()
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC))
        return self._producer.produce(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._producer, name)


class FailingDelivery:
    """Wraps a real producer; the first ``times`` records it is given are not sent but reported
    failed at the next ``poll`` or ``flush`` with ``UNKNOWN``, as a broker restarted empty answers a
    record whose producer's metadata still named the topic (the delivery a roll fails)."""

    def __init__(self, producer, times: int = 1):
        self._producer = producer
        self._times = times
        self._failing: list = []  # (on_delivery, the record) to report at the next poll
        self.failed = 0

    def produce(self, topic, value=None, key=None, on_delivery=None, **kwargs):
        if self.failed < self._times:
            self.failed += 1
            self._failing.append((on_delivery, Message(topic=topic, key=key, value=value)))
            return None
        return self._producer.produce(
            topic, value=value, key=key, on_delivery=on_delivery, **kwargs
        )

    def _report_failures(self) -> None:
        failing, self._failing = self._failing, []
        for on_delivery, record in failing:
            on_delivery(KafkaError(KafkaError.UNKNOWN), record)

    def poll(self, *timeout):
        self._report_failures()
        return self._producer.poll(*timeout)

    def flush(self, *timeout):
        self._report_failures()
        return self._producer.flush(*timeout)

    def undelivered_after_flush(self, timeout_s: float) -> int:
        self._report_failures()
        return self._producer.undelivered_after_flush(timeout_s)

    @property
    def in_flight(self) -> int:
        return self._producer.in_flight + len(self._failing)

    def __getattr__(self, name):
        return getattr(self._producer, name)
