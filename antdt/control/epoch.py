"""The controller epoch: how controllers claim it on the control topic and how a claim is read.

Kept apart from the service so that ``antdt control`` can refuse a hand-set
epoch and show the current one without loading the controller's metrics.
"""

from __future__ import annotations

from datetime import UTC, datetime

from antdt.schemas.models import ControlComponent, ControlConfig

EPOCH_KEY = "controller.epoch"


def epoch_claim(epoch: int, controller_id: str) -> ControlConfig:
    """The control record by which a controller takes ``epoch``."""
    return ControlConfig(
        config_id=f"epoch-{epoch}-{controller_id}",
        job_id=None,
        component=ControlComponent.CONTROLLER,
        changes={EPOCH_KEY: str(epoch)},
        issued_by=controller_id,
        issued_at=datetime.now(UTC),
    )


def claimed_epoch(change: ControlConfig) -> int | None:
    """The epoch a control record claims, if it is an epoch claim."""
    value = change.changes.get(EPOCH_KEY)
    return int(value) if value is not None and value.isdigit() else None
