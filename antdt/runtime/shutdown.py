"""Graceful shutdown on SIGINT and SIGTERM for long-running commands and services.

Orchestrators stop containers with SIGTERM and people with Ctrl-C; both must
lead to the same clean path (flush producers, leave groups, stop children).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_on_signals(
    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[threading.Event]:
    """Yield an Event that is set when one of ``signals`` arrives; restore handlers after."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in signals}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C: KeyboardInterrupt, so every ``finally`` and context exit runs.

    For commands that own child processes (the demo, the benchmark): without
    it, SIGTERM ends the parent at once and the children are left running.
    """

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
