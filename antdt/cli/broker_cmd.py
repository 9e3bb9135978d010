"""``antdt broker``: run the embedded Kafka-compatible broker in the foreground."""

from __future__ import annotations

import typer

from antdt.broker import DEFAULT_PORT, EmbeddedBroker
from antdt.shutdown import stop_on_signals


def broker(
    port: int = typer.Option(DEFAULT_PORT, "--port", "-p", min=1, max=65535, help="Loopback port to listen on."),
) -> None:
    """Run the embedded broker (Tansu, in memory) until Ctrl-C or SIGTERM."""
    with stop_on_signals() as stop, EmbeddedBroker(port=port) as running:
        typer.echo(f"embedded broker ready in {running.ready_after_s:.3f} s")
        typer.echo(f"bootstrap servers: {running.bootstrap_servers}")
        typer.echo(f"export ANTDT_BOOTSTRAP_SERVERS={running.bootstrap_servers} ANTDT_BROKER_PROFILE=embedded")
        while not stop.wait(0.2):
            if not running.is_running():
                raise typer.Exit(1)
        typer.echo("stopping embedded broker")
