"""A Faust stream whose batches wake on a record's arrival, not on a clock.

Faust's ``Stream.take_events(max_, within)`` waits for a full buffer with a
timeout of ``within`` and then starts waiting again, so an idle stream still
wakes every ``within``: at the monitor's 10 ms that is a hundred wake-ups a
second, each building the futures of ``Service.wait_first`` (a py-spy of an
idle monitor: its event loop thread 5.7 % of a core on this machine, the
rest of the process about 2 %; docs/monitor.md). :class:`ArrivalStream`
keeps the same contract (at most ``max_`` events, yielded at most ``within``
after the first of them arrived, acknowledged once the batch is consumed)
but sleeps until a record arrives or the stream stops, waking besides
only every :data:`IDLE_WAKE_S`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import faust
from mode.utils.aiter import aiter
from mode.utils.futures import notify

#: How often an idle stream's batch loop wakes with nothing to yield (a stop wakes it at once).
IDLE_WAKE_S = 1.0


class ArrivalStream(faust.Stream):
    """``take_events`` that waits for the first record instead of polling (module docstring)."""

    def take_events(self, max_: int, within: Any) -> AsyncGenerator[list, None]:
        batches = self._take_on_arrival(max_, float(within))
        self._active_agens.add(batches)  # closed by Stream.on_stop, as Faust's own take_events
        return batches

    async def _take_on_arrival(self, max_: int, within: float) -> AsyncGenerator[list, None]:
        events: list = []
        arrived, full, consumed = asyncio.Event(), asyncio.Event(), asyncio.Event()
        consuming: asyncio.Future | None = None
        channel_it = aiter(self.channel)
        enable_acks = self.enable_acks

        async def add_to_buffer(value: Any) -> Any:
            """The stream's processor: every value's event into the batch, none while the
            batch is being consumed, none past ``max_``."""
            nonlocal consuming
            try:
                if consuming is not None:
                    try:
                        await consuming
                    finally:
                        consuming = None
                if self.current_event is None:
                    raise RuntimeError("the take buffer found no current event")
                events.append(self.current_event)
                arrived.set()
                if len(events) >= max_:
                    full.set()
                    consumed.clear()
                    await self.wait(consumed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # as Faust's take: the stream crashes, it does not hang
                self.log.exception("Error adding to take buffer: %r", exc)
                await self.crash(exc)
            return value

        self.enable_acks = False  # acknowledged below, once the batch is consumed
        self.add_processor(add_to_buffer)
        self._enable_passive(channel_it)
        try:
            while not self.should_stop:
                await self.wait_for_stopped(arrived, timeout=IDLE_WAKE_S)
                if not events:
                    continue
                if len(events) < max_:
                    await self.wait_for_stopped(full, timeout=within)
                consuming = self.loop.create_future()
                try:
                    yield list(events)
                finally:
                    for event in events:
                        await self.ack(event)
                    events.clear()
                    arrived.clear()
                    notify(consuming)
                    full.clear()
                    consumed.set()
        finally:
            self.enable_acks = enable_acks
            self._processors.remove(add_to_buffer)
