"""The agent's event emitter across a bus reset: an event the producer refuses because a reset took
its topic waits and goes out once the topic is back, instead of being dropped as a bug."""

from __future__ import annotations

from antdt.schemas.models import LifecycleEvent, WorkerLifecycle
from antdt.schemas.types import utc_now
from antdt.topics import topic_spec
from antdt.worker.emitter import EventEmitter
from tests.refusing import FailingDelivery, RefusingProducer
from tests.waiting import wait_until
from tests.worker.test_agent import read_topic


def heartbeat(worker: str) -> WorkerLifecycle:
    return WorkerLifecycle(
        job_id="job-emit",
        worker_id=worker,
        incarnation="i1",
        host="h",
        pid=1,
        event=LifecycleEvent.HEARTBEAT,
        timestamp=utc_now(),
    )


def test_an_event_refused_for_a_topic_a_reset_took_waits_and_is_delivered(settings, topics):
    """At a broker roll the emitter's producer can see a topic gone before the watch makes it
    again; the emitter used to drop that event ("cannot be produced", counted as failed) and with it
    a worker's LEFT or a report. It now keeps it first in its queue and sends it, in order, once the
    topic takes records again."""
    topic = topic_spec("worker", "lifecycle").full_name(settings.topic_prefix)
    emitter = EventEmitter(settings, "emitter-test").start()
    refusing = emitter._producer = RefusingProducer(emitter._producer)
    try:
        for worker in ("first", "second"):
            emitter.emit(topic, "job-emit", heartbeat(worker))
        wait_until(lambda: emitter.delivered == 2)
    finally:
        emitter.close()
    assert refusing.refused == 1 and emitter.refused == 1
    assert emitter.failed == 0 and emitter.dropped == 0
    sent = read_topic(settings, "worker", "lifecycle", want=lambda found: len(found) >= 2)
    assert [event.worker_id for event in sent] == ["first", "second"]


def test_an_event_whose_delivery_a_reset_failed_is_sent_again_in_order(settings, topics):
    """A producer whose metadata still names a topic the restarted broker lost has the record fail
    on delivery (UNKNOWN). The emitter used to count that event dropped; it now puts it back at
    the front of its queue as it was encoded, and it is delivered ahead of what came after it."""
    topic = topic_spec("worker", "lifecycle").full_name(settings.topic_prefix)
    emitter = EventEmitter(settings, "emitter-test").start()
    failing = emitter._producer = FailingDelivery(emitter._producer)
    try:
        emitter.emit(topic, "job-emit", heartbeat("first"))
        wait_until(lambda: emitter.refused == 1)
        emitter.emit(topic, "job-emit", heartbeat("second"))
        wait_until(lambda: emitter.delivered == 2)
    finally:
        emitter.close()
    assert failing.failed == 1 and emitter.failed == 0 and emitter.dropped == 0
    sent = read_topic(settings, "worker", "lifecycle", want=lambda found: len(found) >= 2)
    assert [event.worker_id for event in sent] == ["first", "second"]
