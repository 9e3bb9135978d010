"""Waiting, bounded, for what another thread or process does."""

from __future__ import annotations

import asyncio
import time


def wait_until(condition, timeout_s: float = 10.0, pause_s: float = 0.02) -> None:
    """Return once ``condition()`` holds; fail the test if it does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout_s:g} s"
        time.sleep(pause_s)


async def wait_until_async(condition, timeout_s: float = 10.0, pause_s: float = 0.01) -> None:
    """:func:`wait_until` inside an event loop: pauses without blocking the loop that has to make
    ``condition()`` true."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout_s:g} s"
        await asyncio.sleep(pause_s)
