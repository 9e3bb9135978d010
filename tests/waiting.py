"""Waiting, bounded, for what another thread or process does."""

from __future__ import annotations

import time


def wait_until(condition, timeout_s: float = 10.0, pause_s: float = 0.02) -> None:
    """Return once ``condition()`` holds; fail the test if it does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout_s:g} s"
        time.sleep(pause_s)
