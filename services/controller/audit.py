"""Reading the commands topic back: it is the controller's audit log.

Every command carries its reason, evidence, policy, epoch and the id of the
verdict that caused it. A job's commands are keyed by worker, so they spread
over the topic's partitions; :func:`read_commands` reads all of them up to
markers written when it starts (later commands are not included).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime

from antdt.bus.admin import partition_counts
from antdt.bus.clients import consuming, make_admin, producing
from antdt.bus.readers import read_to_markers
from antdt.errors import AntdtError
from antdt.schemas.codec import Codec
from antdt.schemas.models import MitigationCommand
from antdt.settings import Settings

log = logging.getLogger(__name__)


def read_commands(
    settings: Settings, codec: Codec, job_id: str | None = None, start: datetime | None = None, end: datetime | None = None,
) -> Iterator[MitigationCommand]:
    """Commands (of ``job_id``, issued within ``[start, end]``), partition by partition in log order."""
    topic = settings.topic("controller", "commands")
    partitions = list(range(partition_counts(make_admin(settings), [topic])[topic]))
    with producing(settings) as producer, consuming(settings) as consumer:
        for message in read_to_markers(consumer, producer, topic, partitions, b"*"):
            try:
                command = codec.decode(message.value(), topic)
            except AntdtError as exc:
                log.warning("unreadable record %s[%d]@%d: %s", topic, message.partition(), message.offset(), exc)
                continue
            if not isinstance(command, MitigationCommand):
                continue
            if job_id is not None and command.job_id != job_id:
                continue
            if (start is None or command.issued_at >= start) and (end is None or command.issued_at <= end):
                yield command

