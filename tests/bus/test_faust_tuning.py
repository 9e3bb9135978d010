"""The Faust tuning antdt depends on: these pin Faust internals so an upgrade that moves them fails
here."""

from __future__ import annotations

import asyncio

from antdt.bus.faust_app import make_faust_app
from antdt.bus.faust_tuning import QuietMonitor, TunedConsumer
from antdt.settings import BrokerProfile, load_settings


def app_for(profile: BrokerProfile):
    settings = load_settings(
        bootstrap_servers="localhost:1", broker_profile=profile, topic_prefix="tune"
    )
    return make_faust_app(settings, "tuning-test")


def test_the_worker_consumer_uses_antdts_fetch_wait():
    for profile, expected in ((BrokerProfile.EMBEDDED, 10), (BrokerProfile.KAFKA, 100)):
        app = app_for(profile)
        assert isinstance(app.consumer, TunedConsumer)

        async def create(app=app):  # aiokafka wants a running loop
            return app.consumer._thread._create_worker_consumer(app.transport)

        assert asyncio.run(create())._fetch_max_wait_ms == expected


def test_the_app_uses_the_quiet_monitor_sensor():
    assert isinstance(app_for(BrokerProfile.EMBEDDED).monitor, QuietMonitor)


def is_open(consumer, suspend) -> bool:
    async def deliver():
        return None

    pair = (deliver(), suspend.wait())
    try:
        return consumer._is_open_delivery(pair, None)
    finally:
        for coroutine in pair:
            coroutine.close()


def test_an_open_delivery_is_awaited_directly_and_a_suspended_one_takes_fausts_path():
    app = app_for(BrokerProfile.EMBEDDED)
    app.flow_control.resume()  # as a started worker has it
    consumer = app.consumer
    calls = []

    async def deliver():
        calls.append("delivered")
        return "done"

    async def scenario():
        suspend = consumer.suspend_flow
        assert is_open(consumer, suspend)
        result = await consumer.wait_first(deliver(), suspend.wait())
        assert result.results == ["done"] and not result.stopped
        suspend.set()  # a rebalance: Faust's own race decides
        assert not is_open(consumer, suspend)

    asyncio.run(scenario())
    assert calls == ["delivered"]
