"""``antdt controller``: run the mitigation controller until Ctrl-C or SIGTERM."""

from __future__ import annotations

import typer

from antdt.cli.serving import configure_logging, serve
from antdt.control.topic import parse_assignments
from antdt.errors import ConfigError
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.policy import load_policy
from antdt.settings import load_settings


def controller(
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="Default KEY=VALUE (e.g. policy=antdt-dd, dry_run=true); repeatable. "
        "Run-time changes come from the control topic as controller.KEY.",
    ),
    http_port: int = typer.Option(
        9404, min=0, max=65535, help="Port for /healthz, /readyz, /metrics (0: none)."
    ),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Turn verdicts into signed, fenced mitigation commands through a policy (AntDT-ND, AntDT-DD or
    yours)."""
    try:
        defaults = ControllerConfig().with_changes(parse_assignments(set_))
        load_policy(defaults.policy)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--set") from None
    # Imported here, not at the top: every command shares one process registry, and a
    # service's /metrics must show its own metrics only.
    from antdt.services.controller.k8s import KubernetesActuator, load_kubernetes_settings
    from antdt.services.controller.service import ControllerService

    configure_logging(log_level)
    settings = load_settings()
    actuator = KubernetesActuator.from_settings(load_kubernetes_settings())
    serve(
        settings,
        lambda: ControllerService(settings, defaults, actuator=actuator),
        http_port,
        lambda service: (
            f"controller {service.controller_id} (epoch {service.core.stamp.epoch}, "
            f"policy {defaults.policy}) serving on {settings.bootstrap_servers}"
        ),
    )
