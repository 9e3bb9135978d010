"""The bus a demo or benchmark runs on: ``ANTDT_BOOTSTRAP_SERVERS`` if set, else an embedded
broker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.embedded.broker import EmbeddedBroker
from antdt.errors import BusUnreachable
from antdt.settings import BrokerProfile, Settings, load_settings

#: How long an external bus (``ANTDT_BOOTSTRAP_SERVERS``) has to answer before the command gives up.
EXTERNAL_BUS_WITHIN_S = 15.0


def external_bus() -> bool:
    """True when ``ANTDT_BOOTSTRAP_SERVERS`` names a bus to use instead of an embedded broker."""
    return "ANTDT_BOOTSTRAP_SERVERS" in os.environ


@contextmanager
def run_bus(create_topics: bool = True) -> Iterator[tuple[Settings, str]]:
    """(settings, a description of where) for the duration; the embedded broker is stopped on
    exit."""
    with bus_and_broker(create_topics) as (settings, where, _):
        yield settings, where


@contextmanager
def bus_and_broker(
    create_topics: bool = True, port: int | None = None
) -> Iterator[tuple[Settings, str, EmbeddedBroker | None]]:
    """Like :func:`run_bus`, with the embedded broker (None on an external bus), e.g. to restart it.

    ``port``: the embedded broker's (default a free one); an external bus keeps its own.
    """
    if external_bus():
        settings = load_settings()
        if create_topics:
            _ensure_external_topics(settings)
        yield settings, settings.bootstrap_servers, None
        return
    with EmbeddedBroker(port=port) as broker:
        settings = load_settings(
            bootstrap_servers=broker.bootstrap_servers, broker_profile=BrokerProfile.EMBEDDED
        )
        if create_topics:
            ensure_topics(make_admin(settings), settings)
        yield (
            settings,
            f"embedded broker {broker.bootstrap_servers} (ready in {broker.ready_after_s:.3f} s)",
            broker,
        )


def _ensure_external_topics(settings: Settings) -> None:
    """The topics on the bus ``ANTDT_BOOTSTRAP_SERVERS`` names; if it does not answer, say why
    this command went there: the variable is often left over from an earlier ``antdt up``."""
    try:
        ensure_topics(make_admin(settings), settings, timeout_s=EXTERNAL_BUS_WITHIN_S)
    except BusUnreachable as exc:
        raise BusUnreachable(
            f"{exc} (ANTDT_BOOTSTRAP_SERVERS is set, so this uses that bus instead of starting an "
            "embedded broker; if it was an earlier antdt up's, that broker is gone: unset "
            "ANTDT_BOOTSTRAP_SERVERS and ANTDT_BROKER_PROFILE)"
        ) from None
