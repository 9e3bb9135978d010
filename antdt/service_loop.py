"""The run loop shared by the services that poll Kafka themselves (sharder, controller)."""

from __future__ import annotations

import threading


class LoopService:
    """``run(stop)``: start if needed, ``step()`` until ``stop`` is set, then ``close()``, even on error.

    Subclasses provide ``start()``, ``step()`` and ``close()``, and set
    ``_consumer`` in ``start()`` (None means not started).
    """

    _consumer = None

    def start(self) -> LoopService:
        raise NotImplementedError

    def step(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set, then close cleanly."""
        if self._consumer is None:
            self.start()
        try:
            while not stop.is_set():
                self.step()
        finally:
            self.close()
