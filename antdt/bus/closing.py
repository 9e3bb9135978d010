"""A consumer whose close is bounded.

librdkafka's consumer close leaves the group and waits for what the group
still owes the coordinator (a commit in flight, say) without a bound: with
the broker gone it never returns (confluent-kafka-python issue 1667, open),
and a service told to stop then hangs at its exit. :class:`BoundedConsumer`
closes on a thread of its own and gives up waiting after ``timeout_s`` with
a warning: the process that closes is leaving, and its exit ends the thread.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Consumer

log = logging.getLogger(__name__)

#: How long a close may wait for the group (leaving it takes milliseconds with a broker).
CLOSE_WITHIN_S = 10.0


class BoundedConsumer(Consumer):
    """A :class:`confluent_kafka.Consumer` whose ``close()`` returns within a bound."""

    def close(self, timeout_s: float = CLOSE_WITHIN_S) -> None:
        """Close, waiting at most ``timeout_s``; what the close raised (a rebalance callback's
        error, run by it) is raised here."""
        failed: list[BaseException] = []

        def close_here() -> None:
            try:
                super(BoundedConsumer, self).close()
            except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
                failed.append(exc)

        closing = threading.Thread(target=close_here, name="antdt-consumer-close", daemon=True)
        closing.start()
        closing.join(timeout_s)
        if closing.is_alive():
            log.warning(
                "a consumer did not close within %g s (the broker gone?): left to the exit",
                timeout_s,
            )
        elif failed:
            raise failed[0]
