"""Counting the fetches a worker-side reader sends, from librdkafka's own statistics."""

from __future__ import annotations

import time

import orjson

from antdt.bus import own_key
from antdt.bus.clients import make_consumer


class FetchCounter:
    """The fetches sent by the readers made while it counts (statistics served by their polls)."""

    def __init__(self):
        self.sent = 0

    def __call__(self, stats_json: str) -> None:
        brokers = orjson.loads(stats_json)["brokers"].values()
        self.sent = sum(broker["req"].get("Fetch", 0) for broker in brokers)

    def during_idle(self, consumer, seconds: float = 1.0) -> int:
        """Fetches ``consumer`` sent over ``seconds`` in which its owner awaits nothing."""
        consumer.poll(0.2)  # statistics up to now
        before, until = self.sent, time.monotonic() + seconds
        while time.monotonic() < until:
            consumer.poll(0.05)
        return self.sent - before


def count_reply_fetches(monkeypatch) -> FetchCounter:
    """Every reply reader made from now on (:class:`antdt.bus.own_key.OwnKeyClient`) reports its
    fetches to the counter returned (one reader at a time: the last statistics win)."""
    counter = FetchCounter()

    def counted(*args, **kwargs):
        return make_consumer(*args, **kwargs, **{"statistics.interval.ms": 50}, stats_cb=counter)

    monkeypatch.setattr(own_key, "make_consumer", counted)
    return counter
