"""Running a polling service from its command: logging, the health endpoint, one look at the bus,
then the service built, started and served until a signal."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import typer

from antdt.bus.admin import look_at_bus
from antdt.bus.config import describe_profile
from antdt.runtime.observability import HealthServer
from antdt.runtime.shutdown import stop_on_signals
from antdt.settings import Settings

#: A service's first look at the bus: the bound its first metadata request had before the look.
LOOK_UP_WITHIN_S = 15.0

Service = TypeVar("Service")


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )


class _Built:
    """The service once it exists: ``/readyz`` answers 503 until then (the health endpoint is up
    while the look at the bus still waits, so an orchestrator sees the process alive)."""

    def __init__(self) -> None:
        self.service = None

    def ready(self) -> bool:
        return self.service is not None and self.service.ready.is_set()


@contextmanager
def built_after_a_look(
    settings: Settings, build: Callable[[], Service], http_port: int
) -> Iterator[Service]:
    """The health endpoint on ``http_port`` (0: none) for as long as this lasts, then one look at
    the bus, then the service ``build`` makes.

    The look comes before ``build`` makes the service's clients: each client retries a refused
    login on its own, so a wrong password ends the process after one client's attempts, not after
    every client's (AuthenticationError, or BusUnreachable after 15 s).
    """
    built = _Built()
    health = HealthServer(http_port, built.ready).start() if http_port else None
    try:
        look_at_bus(settings, LOOK_UP_WITHIN_S)
        built.service = build()
        yield built.service
    finally:
        if health:
            health.stop()


def serve(
    settings: Settings,
    build: Callable[[], Service],
    http_port: int,
    banner: Callable[[Service], str],
) -> None:
    """Build the service (a LoopService) with ``build`` after a look at the bus
    (:func:`built_after_a_look`) and serve it until Ctrl-C or SIGTERM; ``/healthz``, ``/readyz``,
    ``/metrics`` on ``http_port`` (0: none).

    ``banner(service)`` is printed once the service has started (it may name what start-up
    decided), then the broker profile its clients run with.
    """
    with built_after_a_look(settings, build, http_port) as service, stop_on_signals() as stop:
        service.start()
        typer.echo(banner(service))
        typer.echo(describe_profile(settings))
        service.run(stop)
