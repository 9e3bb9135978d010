"""A polling service (:class:`~antdt.runtime.service_loop.LoopService`) on a background thread, for
tests."""

from __future__ import annotations

import threading
from contextlib import contextmanager


@contextmanager
def running_loop(service, name: str):
    """Start ``service``, run its loop on a thread, stop it (flushed) on exit.

    If the loop died, leaving says so (with its error) instead of letting
    the test blame the clients that waited for it.
    """
    if not service.started:  # a test may have started it to look at it first
        service.start()
    stop = threading.Event()
    died: list[BaseException] = []

    def serve() -> None:
        try:
            service.run(stop)
        except BaseException as exc:  # noqa: BLE001 - reported on exit
            died.append(exc)
            raise

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        stop.set()
        thread.join(15)
    if died:
        raise AssertionError(f"the {name}'s loop died: {died[0]!r}") from died[0]
