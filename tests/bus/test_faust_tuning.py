"""The Faust tuning antdt depends on: these pin Faust internals so an upgrade that moves them fails
here."""

from __future__ import annotations

import asyncio
from functools import partial
from unittest.mock import patch

from aiokafka import client as aiokafka_client
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.metadata import MetadataRequest

from antdt.bus.clients import make_admin
from antdt.bus.faust_app import describe_faust, make_faust_app
from antdt.bus.faust_tuning import QuietMonitor, TunedConsumer
from antdt.settings import BrokerProfile, load_settings


def app_for(profile: BrokerProfile):
    settings = load_settings(
        bootstrap_servers="localhost:1", broker_profile=profile, topic_prefix="tune"
    )
    return make_faust_app(settings, "tuning-test")


def test_the_worker_consumer_uses_antdts_fetch_wait():
    for profile, expected in ((BrokerProfile.EMBEDDED, 25), (BrokerProfile.KAFKA, 100)):
        app = app_for(profile)
        assert isinstance(app.consumer, TunedConsumer)

        async def create(app=app):  # aiokafka wants a running loop
            return app.consumer._thread._create_worker_consumer(app.transport)

        assert asyncio.run(create())._fetch_max_wait_ms == expected


def test_the_apps_group_settings_are_fausts_on_kafka_and_short_on_the_embedded_broker():
    assert describe_faust(app_for(BrokerProfile.KAFKA)) == (
        "faust clients: broker_session_timeout=60 s, broker_heartbeat_interval=3 s, "
        "broker_rebalance_timeout=60 s, fetch.wait.max.ms=100"
    )
    assert describe_faust(app_for(BrokerProfile.EMBEDDED)) == (
        "faust clients: broker_session_timeout=2 s, broker_heartbeat_interval=0.2 s, "
        "broker_rebalance_timeout=2 s, fetch.wait.max.ms=25"
    )


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


def topics_after_asking(settings, topic: str, request=None) -> set[str]:
    """Ask aiokafka for ``topic``'s metadata (with ``request`` as its request class, if given)."""

    async def ask():
        client = AIOKafkaClient(bootstrap_servers=settings.bootstrap_servers)
        await client.bootstrap()
        try:
            client.add_topic(topic)
            await client.force_metadata_update()
        finally:
            await client.close()

    if request is None:
        asyncio.run(ask())
    else:
        with patch.object(aiokafka_client, "MetadataRequest", request):
            asyncio.run(ask())
    return set(make_admin(settings).list_topics(timeout=10).topics)


def test_aiokafka_never_creates_a_topic_by_asking_for_it(settings):
    """After a broker restart the monitor's consumer made worker.metrics with 4 partitions, not
    6."""
    app_for(BrokerProfile.EMBEDDED)  # building the app forbids it
    missing = f"{settings.topic_prefix}.asked.for"
    assert missing not in topics_after_asking(settings, missing)
    # aiokafka's own request would have made it: the broker creates topics on request
    asked = partial(MetadataRequest, allow_auto_topic_creation=True)
    assert missing in topics_after_asking(settings, missing, request=asked)
