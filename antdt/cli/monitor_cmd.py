"""``antdt monitor``: run the straggler and leader monitor (a Faust worker) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging

import typer
from mode import Worker

from antdt.bus.faust_tuning import tune_gc_for_streaming
from antdt.control import parse_assignments
from antdt.errors import ConfigError
from antdt.observability import HealthServer
from antdt.services.monitor.detection import DetectorConfig
from antdt.settings import load_settings


def monitor(
    set_: list[str] = typer.Option(
        [], "--set", help="Detector default KEY=VALUE (e.g. straggler_ratio=1.4, window_s=20); repeatable. "
        "Run-time changes come from the control topic as monitor.KEY."
    ),
    batch: int = typer.Option(2000, min=1, help="Most reports processed as one batch."),
    http_port: int = typer.Option(9403, min=0, max=65535, help="Port for /healthz, /readyz, /metrics (0: none)."),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Detect and classify stragglers and leaders from worker metrics; publish verdicts."""
    try:
        defaults = DetectorConfig().with_changes(parse_assignments(set_))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--set") from None
    # Imported here, not at the top: every command shares one process registry, and a
    # service's /metrics must show its own metrics only.
    from antdt.services.monitor.app import MonitorConfig, MonitorService

    settings = load_settings()
    service = MonitorService(settings, defaults, MonitorConfig(batch_max=batch))
    health = HealthServer(http_port, service.ready.is_set).start() if http_port else None
    try:
        service.start()
        typer.echo(f"monitor serving on {settings.bootstrap_servers} (prefix {settings.topic_prefix})")
        worker = Worker(service.app, loglevel=log_level.lower(), redirect_stdouts=False)
        tune_gc_for_streaming()
        try:
            worker.execute_from_commandline()
        except SystemExit:
            pass
        logging.getLogger(__name__).info("monitor stopped")
    finally:
        service.close()
        if health:
            health.stop()
