"""``antdt grouper``: run the partial-reduce group coordinator until Ctrl-C or SIGTERM."""

from __future__ import annotations

import typer

from antdt.cli.serving import configure_logging, serve
from antdt.settings import load_settings


def grouper(
    group_size: int = typer.Option(
        2, min=2, max=1024, help="P: workers averaged together in a partial reduce."
    ),
    deadline_ms: float = typer.Option(
        50.0, min=0, help="The first ready worker waits at most this long for P-1 others."
    ),
    checkpoint_every_s: float = typer.Option(
        60.0, min=0, help="Gather every rank for a checkpoint this often (0: never)."
    ),
    http_port: int = typer.Option(
        9406, min=0, max=65535, help="Port for /healthz, /readyz, /metrics (0: none)."
    ),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Form partial-reduce groups of ready workers, first come first served."""
    # Imported here: every command shares one process registry, and /metrics must show the grouper's
    # own.
    from antdt.services.grouper.core import GrouperConfig
    from antdt.services.grouper.service import GrouperService

    configure_logging(log_level)
    settings = load_settings()
    config = GrouperConfig(
        group_size=group_size, deadline_s=deadline_ms / 1000, checkpoint_every_s=checkpoint_every_s
    )
    serve(
        settings,
        lambda: GrouperService(settings, config),
        http_port,
        lambda service: (
            f"grouper {service.instance_id} serving on {settings.bootstrap_servers} "
            f"(prefix {settings.topic_prefix}, P={group_size}, deadline {deadline_ms:g} ms)"
        ),
    )
