"""``antdt demo``: start what is needed and show antdt working.

Until the full straggler demo lands, this runs the bus check
(:mod:`antdt.buscheck`) on the embedded broker, or on
``ANTDT_BOOTSTRAP_SERVERS`` when that is set.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import typer
from rich.console import Console
from rich.table import Table

from antdt.broker import EmbeddedBroker
from antdt.buscheck import run_bus_check
from antdt.settings import BrokerProfile, load_settings


def demo() -> None:
    """Run the bus check: every message type through a real broker, plus the dead-letter path."""
    console = Console()
    external = "ANTDT_BOOTSTRAP_SERVERS" in os.environ
    with nullcontext() if external else EmbeddedBroker() as broker:
        overrides = {} if external else {"bootstrap_servers": broker.bootstrap_servers, "broker_profile": BrokerProfile.EMBEDDED}
        settings = load_settings(**overrides)
        where = settings.bootstrap_servers if external else f"embedded broker {settings.bootstrap_servers} (ready in {broker.ready_after_s:.3f} s)"
        console.print(f"[bold]antdt bus check[/bold] on {where}")
        result = run_bus_check(settings)
    table = Table("topic", "message", "bytes", "round trip ms", "decoded equal")
    for row in result.rows:
        table.add_row(row.topic, row.message, str(row.encoded_bytes), f"{row.round_trip_ms:.1f}", "yes" if row.decoded_equal else "[red]NO[/red]")
    console.print(table)
    console.print(f"corrupt records dead-lettered: {result.dead_lettered}")
    console.print("[green]bus check passed[/green]" if result.ok else "[red]bus check FAILED[/red]")
    if not result.ok:
        raise typer.Exit(1)
