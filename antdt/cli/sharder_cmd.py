"""``antdt sharder``: run the sharding service until Ctrl-C or SIGTERM."""

from __future__ import annotations

import typer

from antdt.cli.serving import configure_logging, serve
from antdt.settings import load_settings


def sharder(
    default_quota: int = typer.Option(
        2, min=1, max=64, help="Shards a worker may hold when it names no quota."
    ),
    snapshot_every: int = typer.Option(10_000, min=1, help="Snapshot a job every N log events..."),
    snapshot_seconds: float = typer.Option(
        30.0, min=0.1, help="...or every T seconds, whichever comes first."
    ),
    http_port: int = typer.Option(
        9402, min=0, max=65535, help="Port for /healthz, /readyz, /metrics (0: none)."
    ),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Serve data shards to workers from an event-sourced, replayable log."""
    # Imported here, not at the top: every command shares one process registry, and a
    # service's /metrics must show its own metrics only.
    from antdt.runtime.memory import SHARDER_ARENAS, SHARDER_FREEZE_EVERY_S, limit_malloc_arenas
    from antdt.services.sharder.service import SharderConfig, SharderService

    limit_malloc_arenas(SHARDER_ARENAS)  # before any thread of the service starts
    configure_logging(log_level)
    settings = load_settings()
    config = SharderConfig(
        default_quota=default_quota,
        snapshot_every_events=snapshot_every,
        snapshot_every_s=snapshot_seconds,
        freeze_heap_every_s=SHARDER_FREEZE_EVERY_S,  # this process is the sharder's alone
    )
    serve(
        settings,
        lambda: SharderService(settings, config),
        http_port,
        lambda service: (
            f"sharder {service.writer_id} serving on {settings.bootstrap_servers} "
            f"(prefix {settings.topic_prefix})"
        ),
    )
