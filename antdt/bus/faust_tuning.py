"""Faust tuned for latency and throughput: transport, sensor and garbage collector.

Faust 0.15 leaves five things that the monitor's targets cannot live with
(measured with ``bench/monitor_bench.py --only throughput``):

* **fetch wait**: the worker consumer is created with a fixed
  ``fetch_max_wait_ms=1500``. On Apache Kafka that only bounds idle polling
  (the broker answers as soon as data arrives), but the embedded broker does
  not wake a waiting fetch on produce, so every record waited up to 1.5 s.
  :class:`TunedConsumerThread` uses the fetch wait of the pace its app is
  made with, as every other antdt consumer (:func:`antdt.bus.config.fetch_wait_ms`;
  the monitor's is the background pace: 250 ms embedded, 100 ms on Kafka).
* **per-record delivery**: the drain loop hands each record to the streams
  through ``Service.wait_first(deliver(record), suspend_flow.wait())``, which
  creates four tasks and an ``asyncio.wait`` per record; measured here that
  alone caps a worker at about 8,000 records/s. :class:`TunedConsumer`
  awaits the delivery directly while flow is open (the common case), and
  keeps Faust's own path whenever a rebalance has suspended the flow, so a
  delivery that must be abandoned for a rebalance still is. With this and a
  larger stream buffer the same worker reads about 18,000 records/s.
* **idle wake-ups**: ``Stream.take_events`` wakes every ``within`` with or without records;
  :class:`~antdt.bus.faust_take.ArrivalStream` wakes when one arrives.
* **the Monitor sensor**: Faust's built-in sensor times every event for its
  web views, which antdt disables (services export Prometheus metrics);
  :class:`QuietMonitor` records nothing per event.
* **garbage collection**: Faust allocates several objects per record, so
  with CPython's default thresholds the collector runs every few hundred
  records and its full passes walk every detector window.
  :func:`tune_gc_for_streaming` freezes what start-up allocated and raises
  the young-generation threshold. With the sensor and the collector tuned the
  monitor went from about 10,500 to 13,000-14,700 reports/s.

Besides, aiokafka asks for metadata with topic auto-creation on, and cannot
be told otherwise. Right after an embedded broker restart the monitor's
consumer then re-created ``worker.metrics`` with the broker's default 4
partitions before the bus watch re-created it with the registry's 6, and the
controller refused to run on the mismatch. :func:`forbid_topic_auto_creation`
makes aiokafka ask as every other antdt client does (``allow.auto.create.topics``
off, :mod:`antdt.bus.config`).

A record delivered just as a rebalance starts may still reach its stream;
that is within Faust's at-least-once guarantee, and the consumers of this
transport are idempotent (the monitor drops reports it has seen).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import faust
from aiokafka import client as aiokafka_client
from aiokafka.admin import client as aiokafka_admin
from aiokafka.protocol.metadata import MetadataRequest
from faust.sensors.monitor import Monitor
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.services import WaitResults

from antdt.bus.faust_take import ArrivalStream

_EVENT_WAIT = asyncio.Event.wait.__code__  # the suspend_flow wait the drain loop passes


class TunedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Creates the worker consumer with antdt's fetch wait instead of 1.5 s."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = getattr(
            self.app, "fetch_max_wait_ms", consumer._fetch_max_wait_ms
        )
        return consumer


class TunedConsumer(faust_aiokafka.Consumer):
    """Delivers records without a wait race while no rebalance is in progress."""

    def _new_consumer_thread(self) -> TunedConsumerThread:
        return TunedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        if self._is_open_delivery(coros, timeout):
            deliver, suspend_wait = coros
            suspend_wait.close()
            return WaitResults([deliver], [await deliver], False)
        return await super().wait_first(*coros, timeout=timeout)

    def _is_open_delivery(self, coros: tuple, timeout: Any) -> bool:
        """The drain loop's (deliver, suspend_flow.wait()) call, with the flow open."""
        if timeout is not None or len(coros) != 2:
            return False
        suspend_wait = coros[1]
        return (
            getattr(suspend_wait, "cr_code", None) is _EVENT_WAIT
            and not self.suspend_flow.is_set()
            and self.app.flow_control.is_active()
            and not self.should_stop
        )


class TunedTransport(faust_aiokafka.Transport):
    Consumer = TunedConsumer


class TunedApp(faust.App):
    """A Faust app whose consumer uses :class:`TunedTransport` and whose streams are
    :class:`~antdt.bus.faust_take.ArrivalStream`."""

    def __init__(self, *args: Any, fetch_max_wait_ms: int = 500, **kwargs: Any):
        self.fetch_max_wait_ms = fetch_max_wait_ms
        forbid_topic_auto_creation()
        kwargs.setdefault("Stream", ArrivalStream)
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> TunedTransport:
        return TunedTransport(self.conf.broker_consumer, self)


class QuietMonitor(Monitor):
    """Faust's Monitor sensor without per-message and per-event bookkeeping."""

    def on_message_in(self, *args: Any) -> None:
        """Not recorded: antdt's services count what they process themselves."""

    def on_stream_event_in(self, *args: Any) -> None:
        return None

    def on_stream_event_out(self, *args: Any, **kwargs: Any) -> None:
        """Not recorded."""

    def on_message_out(self, *args: Any) -> None:
        """Not recorded."""


def forbid_topic_auto_creation() -> None:
    """Every aiokafka metadata request in this process asks not to create missing topics.

    aiokafka builds them in its client and admin modules with no setting for
    the flag, so their request class is replaced by one that always clears
    it. Idempotent.
    """
    for module in (aiokafka_client, aiokafka_admin):
        module.MetadataRequest = _no_auto_creation


def _no_auto_creation(
    topics: list[str] | None = None, allow_auto_topic_creation: bool | None = None
) -> MetadataRequest:
    return MetadataRequest(topics, allow_auto_topic_creation=False)


def tune_gc_for_streaming(young_threshold: int = 50_000) -> None:
    """Freeze start-up objects out of collection and collect the young generation less often.

    Call once, after the app is built and before it starts consuming.
    Collections still run; they are fewer and skip the frozen start-up heap.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, max(middle, 20), max(old, 100))
