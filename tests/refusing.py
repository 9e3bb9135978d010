"""A producer that refuses records as librdkafka refuses one for a topic a bus reset took (the
producer's metadata saw the topic gone before a watch made it again): what a broker roll does to a
writer at a moment no test can time."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException


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
