"""``antdt topics``: show the topic registry, create the topics, or print them as Strimzi resources."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.k8s_topics import DEFAULT_CLUSTER, DEFAULT_REPLICAS, kafka_topics_yaml
from antdt.settings import load_settings
from antdt.topics import TOPICS, markdown_table


def topics(
    create: bool = typer.Option(False, "--create", help="Create missing topics on ANTDT_BOOTSTRAP_SERVERS."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the registry as the README's Markdown table."),
    kafka_topics: bool = typer.Option(False, "--kafka-topics", help="Print the registry as Strimzi KafkaTopic YAML."),
    cluster: str = typer.Option(DEFAULT_CLUSTER, "--cluster", help="Strimzi Kafka cluster the KafkaTopics belong to."),
    replicas: int = typer.Option(DEFAULT_REPLICAS, "--replicas", min=1, help="Replication factor of the KafkaTopics."),
) -> None:
    """List antdt's topics (from the registry), create them idempotently, or print them as KafkaTopics."""
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
    table = Table("topic", "partitions", "key", "value", "purpose")
    for spec in TOPICS:
        table.add_row(spec.full_name(settings.topic_prefix), str(spec.partitions), spec.key, spec.value_name, spec.purpose)
    Console().print(table)
