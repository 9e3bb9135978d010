"""``antdt topics``: show the topic registry, or create the topics on a cluster."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.settings import load_settings
from antdt.topics import TOPICS, markdown_table


def topics(
    create: bool = typer.Option(False, "--create", help="Create missing topics on ANTDT_BOOTSTRAP_SERVERS."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the registry as the README's Markdown table."),
) -> None:
    """List antdt's topics (from the registry), or create them idempotently."""
    settings = load_settings()
    if markdown:
        typer.echo(markdown_table(settings.topic_prefix))
        return
    if create:
        counts = ensure_topics(make_admin(settings), settings)
        for name, partitions in counts.items():
            typer.echo(f"{name}\t{partitions} partitions")
        return
    table = Table("topic", "partitions", "key", "value", "purpose")
    for spec in TOPICS:
        table.add_row(spec.full_name(settings.topic_prefix), str(spec.partitions), spec.key, spec.value_name, spec.purpose)
    Console().print(table)
