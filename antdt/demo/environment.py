"""The bus a demo or benchmark runs on: ``ANTDT_BOOTSTRAP_SERVERS`` if set, else an embedded broker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from antdt.broker import EmbeddedBroker
from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.settings import BrokerProfile, Settings, load_settings


@contextmanager
def run_bus(create_topics: bool = True) -> Iterator[tuple[Settings, str]]:
    """(settings, a description of where) for the duration; the embedded broker is stopped on exit."""
    if "ANTDT_BOOTSTRAP_SERVERS" in os.environ:
        settings = load_settings()
        if create_topics:
            ensure_topics(make_admin(settings), settings)
        yield settings, settings.bootstrap_servers
        return
    with EmbeddedBroker() as broker:
        settings = load_settings(bootstrap_servers=broker.bootstrap_servers, broker_profile=BrokerProfile.EMBEDDED)
        if create_topics:
            ensure_topics(make_admin(settings), settings)
        yield settings, f"embedded broker {broker.bootstrap_servers} (ready in {broker.ready_after_s:.3f} s)"
