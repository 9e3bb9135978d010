"""Running a real agent in a test: settings with a signing key, stepping until something
happened."""

from __future__ import annotations

import time

from antdt.settings import Settings, load_settings
from antdt.worker import Agent


def signed_settings(settings: Settings, key: bytes) -> Settings:
    """``settings`` with a command signing key and short report intervals."""
    return load_settings(
        **{
            **settings.model_dump(),
            "signing_key": key.decode(),
            "report_interval_s": 0.2,
            "heartbeat_interval_s": 0.5,
        }
    )


def step_until(agent: Agent, condition, timeout_s: float = 20.0) -> None:
    """Train (empty steps) until ``condition()``: commands are applied at step boundaries."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        agent.step()
        time.sleep(0.005)
