"""ArrivalStream's take_events: Faust's batches, without an idle stream's wake-up every ``within``.

Driven through an agent's test context (Faust's in-memory channel: the
stream's batching is under test here, not the bus)."""

from __future__ import annotations

import asyncio
from unittest.mock import patch

from antdt.bus.faust_app import make_faust_app
from antdt.bus.faust_take import IDLE_WAKE_S, ArrivalStream
from antdt.settings import BrokerProfile, load_settings
from tests.waiting import wait_until_async

WITHIN_S = 0.005


def batching_agent(max_: int):
    """An app whose agent collects each batch's values, and the list it collects them in."""
    settings = load_settings(
        bootstrap_servers="localhost:1", broker_profile=BrokerProfile.EMBEDDED, topic_prefix="take"
    )
    app = make_faust_app(settings, "take-test")
    batches: list[list[int]] = []

    @app.agent(app.channel())
    async def collect(stream):
        assert isinstance(stream, ArrivalStream)
        async for events in stream.take_events(max_, WITHIN_S):
            batches.append([event.value for event in events])

    return collect, batches


def test_every_value_comes_once_in_order_in_batches_of_at_most_max():
    agent, batches = batching_agent(max_=3)

    async def scenario():
        async with agent.test_context() as running:
            for value in range(7):
                await running.put(value)
            await wait_until_async(lambda: sum(map(len, batches)) == 7)

    asyncio.run(scenario())
    assert [value for batch in batches for value in batch] == list(range(7))
    assert all(1 <= len(batch) <= 3 for batch in batches)


def test_a_lone_record_is_yielded_without_waiting_for_a_full_batch():
    agent, batches = batching_agent(max_=1000)

    async def scenario():
        async with agent.test_context() as running:
            await running.put(41)
            await wait_until_async(lambda: batches == [[41]])

    asyncio.run(scenario())


def test_an_idle_stream_does_not_wake_every_within():
    """Idle for 60 times ``within``: Faust's own take_events wakes 60 times, this one at most
    once a second (IDLE_WAKE_S), whatever the machine's speed."""
    agent, batches = batching_agent(max_=10)
    waits = []
    wait_for_stopped = ArrivalStream.wait_for_stopped

    async def counted(self, *events, timeout=None):
        waits.append(timeout)
        return await wait_for_stopped(self, *events, timeout=timeout)

    async def scenario():
        async with agent.test_context() as running:
            await asyncio.sleep(60 * WITHIN_S)
            await running.put(1)
            await wait_until_async(lambda: batches == [[1]])

    with patch.object(ArrivalStream, "wait_for_stopped", counted):
        asyncio.run(scenario())
    # idle, it waits IDLE_WAKE_S at a time (a machine that stalls adds waits of that size, not of
    # within: a count of them would measure the machine); within once, for the batch begun
    assert waits.count(WITHIN_S) <= 1 and set(waits) <= {IDLE_WAKE_S, WITHIN_S}, waits
