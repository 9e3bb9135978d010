"""``antdt control show`` and ``antdt control set``: the run-time configuration on the control
topic.

``set`` writes one ControlConfig record. Its component follows from the key
prefixes (all ``monitor.*``: MONITOR, all ``controller.*``: CONTROLLER, a
mix: ALL). Before writing, the change is checked against the configuration
folded from the whole history, exactly as the services will apply it, so a
change they would refuse is refused here with one line and nothing written.

``show`` folds the history and prints the effective settings that differ
from the defaults, job-wide and per job, and the current controller epoch.
"""

from __future__ import annotations

import getpass
import uuid
from dataclasses import asdict
from datetime import UTC, datetime

import orjson
import typer
from rich.console import Console

from antdt.bus.clients import flush_or_raise, make_producer
from antdt.cli.tables import Column, NarrowTable
from antdt.control.epoch import EPOCH_KEY, claimed_epoch
from antdt.control.topic import ConfigLayers, ControlFollower, control_topic, parse_assignments
from antdt.control.trust import signed_change
from antdt.errors import ConfigError
from antdt.schemas.codec import make_codec
from antdt.schemas.models import ControlComponent, ControlConfig
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.core import validate_policy
from antdt.services.monitor.detection import DetectorConfig
from antdt.settings import load_settings

app = typer.Typer(
    help="Show or change the run-time configuration of the monitor and the controller.",
    no_args_is_help=True,
)


def fold_history(history: list[ControlConfig]) -> tuple[dict[ControlComponent, ConfigLayers], int]:
    """The configuration every service would hold after applying ``history``; the highest controller
    epoch."""
    layers = {
        ControlComponent.MONITOR: ConfigLayers(ControlComponent.MONITOR, DetectorConfig()),
        ControlComponent.CONTROLLER: ConfigLayers(
            ControlComponent.CONTROLLER, ControllerConfig(), check=validate_policy
        ),
    }
    epoch = 0
    for change in history:
        claimed = claimed_epoch(change)
        if claimed is not None:
            epoch = max(epoch, claimed)
            continue
        for layer in layers.values():
            try:
                layer.apply(change)
            except ConfigError:
                pass  # the services refused it too
    return layers, epoch


def folded(settings) -> tuple[dict[ControlComponent, ConfigLayers], int]:
    """The configuration folded from the control topic's whole history."""
    follower = ControlFollower(settings)
    try:
        return fold_history(follower.catch_up())
    finally:
        follower.close()


def component_of(changes: dict[str, str]) -> ControlComponent:
    prefixes = {key.partition(".")[0] for key in changes}
    known = {c.value.lower(): c for c in (ControlComponent.MONITOR, ControlComponent.CONTROLLER)}
    unknown = sorted(p for p in prefixes if p not in known)
    if unknown or not prefixes:
        raise ConfigError(
            "keys must start with monitor. or controller. "
            f"(got {', '.join(sorted(changes)) or 'none'})"
        )
    return known[prefixes.pop()] if len(prefixes) == 1 else ControlComponent.ALL


@app.command("set")
def set_(
    assignments: list[str] = typer.Argument(
        ..., help="monitor.KEY=VALUE or controller.KEY=VALUE, one or more."
    ),
    job: str | None = typer.Option(None, "--job", help="Only for this job (default: every job)."),
) -> None:
    """Write a configuration change; every monitor and controller applies it without a restart."""
    try:
        changes = parse_assignments(assignments)
        if EPOCH_KEY in changes:
            raise ConfigError(f"{EPOCH_KEY} is claimed by controllers at start, not set by hand")
        record = ControlConfig(
            config_id=f"cfg-{uuid.uuid4().hex[:12]}",
            job_id=job,
            component=component_of(changes),
            changes=changes,
            issued_by=_who(),
            issued_at=datetime.now(UTC),
        )
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = load_settings()
    layers, _ = folded(settings)
    for layer in layers.values():
        layer.apply(record)  # ConfigError: refused here exactly as the services would refuse it
    record = signed_change(record, settings)
    if record.signature is None:
        typer.echo(
            "unsigned (no ANTDT_CONTROL_KEY): services with a control key refuse it", err=True
        )
    codec = make_codec(settings.schema_registry_url)
    producer = make_producer(settings)
    producer.produce(control_topic(settings), key=(job or "*").encode(), value=codec.encode(record))
    flush_or_raise(producer)
    typer.echo(
        f"{record.config_id}: {record.component.value} {'job ' + job if job else 'all jobs'}: "
        + ", ".join(f"{k}={v}" for k, v in changes.items())
    )


@app.command("show")
def show(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The effective configuration: what differs from the defaults, job-wide and per job."""
    layers, epoch = folded(load_settings())
    rows = []
    for component, layer in layers.items():
        prefix = component.value.lower()
        defaults = asdict(type(layer.defaults)())
        for key, value in asdict(layer.defaults).items():
            if value != defaults[key]:
                rows.append(("*", f"{prefix}.{key}", value, defaults[key]))
        for job, overrides in sorted(layer.overrides.items()):
            effective = asdict(layer.for_job(job))
            rows += [
                (job, f"{prefix}.{key}", effective[key], defaults[key]) for key in sorted(overrides)
            ]
    if json_:
        typer.echo(
            orjson.dumps(
                {
                    "controller_epoch": epoch,
                    "settings": [
                        {"job": job, "key": key, "value": value, "default": default}
                        for job, key, value, default in rows
                    ],
                }
            ).decode()
        )
        return
    table = NarrowTable(
        CONTROL_COLUMNS, wide=True, title=f"run-time configuration (controller epoch {epoch})"
    )
    for job, key, value, default in rows:
        table.add(job, key, value, default)
    if rows:
        table.print(Console())
    else:
        Console().print(f"all defaults (controller epoch {epoch})")


CONTROL_COLUMNS = [
    Column("job"),
    Column("key"),
    Column("value", free_text=True),
    Column("default", free_text=True),
]


def _who() -> str:
    try:
        return getpass.getuser()[:128] or "antdt"
    except (KeyError, OSError):
        return "antdt"
