"""The run loop shared by the services that poll Kafka themselves (sharder, controller)."""

from __future__ import annotations

import threading

from antdt.bus.clients import drain


class LoopService:
    """``run(stop)``: start if needed, ``step()`` until ``stop`` is set, then ``close()``, even on
    error.

    Subclasses provide ``start()``, ``step()`` and ``close()``, and set
    ``_consumer`` in ``start()`` (None means not started); ``close()`` can
    begin with :meth:`_close_clients`.
    """

    _consumer = None
    _producer = None
    ready: threading.Event

    def start(self) -> LoopService:
        raise NotImplementedError

    @property
    def started(self) -> bool:
        """Started and not closed: a second ``start()`` would join the group twice, and the
        consumer left behind would hold partitions as a member nobody polls."""
        return self._consumer is not None

    def step(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _close_clients(self) -> None:
        """Not ready any more; what was produced delivered; the consumer closed (once)."""
        self.ready.clear()
        if self._producer is not None:
            drain(self._producer)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set, then close cleanly."""
        if not self.started:
            self.start()
        try:
            while not stop.is_set():
                self.step()
        finally:
            self.close()
