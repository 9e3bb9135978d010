"""``antdt topics``: show the topic registry, create the topics, or print them as Strimzi
resources."""

from __future__ import annotations

import typer
from rich.console import Console

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.bus.strimzi import DEFAULT_CLUSTER, DEFAULT_REPLICAS, kafka_topics_yaml
from antdt.cli.tables import WIDE_HELP, Column, NarrowTable
from antdt.settings import load_settings
from antdt.topics import TOPICS, markdown_table


def topics(
    create: bool = typer.Option(
        False, "--create", help="Create missing topics on ANTDT_BOOTSTRAP_SERVERS."
    ),
    markdown: bool = typer.Option(
        False, "--markdown", help="Print the registry as the README's Markdown table."
    ),
    kafka_topics: bool = typer.Option(
        False, "--kafka-topics", help="Print the registry as Strimzi KafkaTopic YAML."
    ),
    cluster: str = typer.Option(
        DEFAULT_CLUSTER, "--cluster", help="Strimzi Kafka cluster the KafkaTopics belong to."
    ),
    replicas: int = typer.Option(
        DEFAULT_REPLICAS, "--replicas", min=1, help="Replication factor of the KafkaTopics."
    ),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
) -> None:
    """List antdt's topics (from the registry), create them idempotently, or print them as
    KafkaTopics."""
    settings = load_settings()
    if markdown:
        typer.echo(markdown_table(settings.topic_prefix))
        return
    if kafka_topics:
        typer.echo(kafka_topics_yaml(settings.topic_prefix, cluster, replicas), nl=False)
        return
    if create:
        counts = ensure_topics(make_admin(settings), settings)
        for name, partitions in counts.items():
            typer.echo(f"{name}\t{partitions} partitions")
        return
    topic_table(settings.topic_prefix, wide).print(Console())


def topic_table(prefix: str, wide: bool) -> NarrowTable:
    table = NarrowTable(TOPIC_COLUMNS, wide)
    for spec in TOPICS:
        table.add(spec.full_name(prefix), spec.partitions, spec.key, spec.value_name, spec.purpose)
    return table


TOPIC_COLUMNS = [
    Column("topic"),
    Column("partitions"),
    Column("key", free_text=True),
    Column("value", free_text=True),
    Column("purpose", wide_only=True, free_text=True),
]
