"""``antdt check``: every message type through a real broker, plus the dead-letter path.

Runs on ``ANTDT_BOOTSTRAP_SERVERS`` when that is set (a quick way to prove a
deployment's Kafka, credentials and topics work), else on the embedded broker.
"""

from __future__ import annotations

import typer
from rich.console import Console

from antdt.bus.selfcheck import run_bus_check
from antdt.cli.tables import Column, NarrowTable
from antdt.demo.environment import run_bus

CHECK_COLUMNS = [
    Column("topic"),
    Column("message"),
    Column("bytes"),
    Column("round trip ms"),
    Column("decoded equal"),
]


def check() -> None:
    """Round-trip every message type through the broker and dead-letter a corrupt record."""
    console = Console()
    with run_bus(create_topics=False) as (settings, where):
        console.print(f"[bold]antdt bus check[/bold] on {where}")
        result = run_bus_check(settings)
    table = NarrowTable(
        CHECK_COLUMNS, wide=True, title="each message type through the broker and back"
    )
    for row in result.rows:
        table.add(
            row.topic,
            row.message,
            row.encoded_bytes,
            f"{row.round_trip_ms:.1f}",
            "yes" if row.decoded_equal else "[red]NO[/red]",
        )
    table.print(console)
    console.print(f"corrupt records dead-lettered: {result.dead_lettered}")
    console.print("[green]bus check passed[/green]" if result.ok else "[red]bus check FAILED[/red]")
    if not result.ok:
        raise typer.Exit(1)
