"""Reading the commands topic back: it is the controller's audit log.

Every command carries its reason, evidence, policy, epoch and the id of the
verdict that caused it. A job's commands are keyed by worker, so they spread
over the topic's partitions; :func:`read_commands` reads all of them up to
markers written when it starts (later commands are not included).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from antdt.bus.readers import read_whole_topic
from antdt.schemas.codec import Codec
from antdt.schemas.models import MitigationCommand
from antdt.settings import Settings


def read_commands(
    settings: Settings,
    codec: Codec,
    job_id: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> Iterator[MitigationCommand]:
    """Commands (of ``job_id``, issued within ``[start, end]``), partition by partition in log
    order."""
    for command in read_whole_topic(
        settings, codec, settings.topic("controller", "commands"), MitigationCommand, job_id
    ):
        if (start is None or command.issued_at >= start) and (
            end is None or command.issued_at <= end
        ):
            yield command
