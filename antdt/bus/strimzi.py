"""Strimzi ``KafkaTopic`` resources generated from the topic registry.

On Kubernetes with Strimzi, the Topic Operator owns the topics, so their
partitions and configs must be exactly those of :data:`antdt.topics.TOPICS`.
Writing the YAML by hand would let the two drift; instead
``antdt topics --kafka-topics`` prints it from the registry, the output is
committed as ``deploy/k8s/components/strimzi/topics.yaml``, and a test checks
the committed file still equals the generator's output.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from antdt.topics import TOPICS, TopicSpec

STRIMZI_API_VERSION = "kafka.strimzi.io/v1beta2"
CLUSTER_LABEL = "strimzi.io/cluster"
DEFAULT_CLUSTER = "antdt"
DEFAULT_REPLICAS = 3

_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")


def resource_name(topic_name: str) -> str:
    """A valid Kubernetes object name for a topic (lower case, ``[a-z0-9.-]``).

    Topic names may hold ``_`` or capitals that Kubernetes names may not; the
    real name then goes into ``spec.topicName`` (see :func:`kafka_topic`).
    """
    return _INVALID_NAME_CHARS.sub("-", topic_name.lower()).strip(".-")


def kafka_topic(spec: TopicSpec, prefix: str, cluster: str, replicas: int) -> dict[str, Any]:
    """One ``KafkaTopic`` for a registry entry, bound to a Strimzi cluster by label."""
    topic_name = spec.full_name(prefix)
    name = resource_name(topic_name)
    body: dict[str, Any] = {
        "partitions": spec.partitions,
        "replicas": replicas,
        "config": dict(spec.configs),
    }
    if name != topic_name:
        # Strimzi recommends topicName only when the object name cannot be the topic name.
        body = {"topicName": topic_name, **body}
    return {
        "apiVersion": STRIMZI_API_VERSION,
        "kind": "KafkaTopic",
        "metadata": {
            "name": name,
            "labels": {CLUSTER_LABEL: cluster, "app.kubernetes.io/part-of": "antdt"},
        },
        "spec": body,
    }


def kafka_topics(
    prefix: str = "antdt", cluster: str = DEFAULT_CLUSTER, replicas: int = DEFAULT_REPLICAS
) -> list[dict[str, Any]]:
    """Every registry topic (the dead-letter topic included) as a ``KafkaTopic``."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    return [kafka_topic(spec, prefix, cluster, replicas) for spec in TOPICS]


def kafka_topics_yaml(
    prefix: str = "antdt", cluster: str = DEFAULT_CLUSTER, replicas: int = DEFAULT_REPLICAS
) -> str:
    """The multi-document YAML committed under ``deploy/k8s``, with a do-not-edit header."""
    command = f"antdt topics --kafka-topics --cluster {cluster} --replicas {replicas}"
    header = (
        f"# Generated from antdt/topics.py by `{command}`\n"
        f"# (topic prefix {prefix!r}, from ANTDT_TOPIC_PREFIX). Do not edit: regenerate.\n"
    )
    documents = yaml.safe_dump_all(
        kafka_topics(prefix, cluster, replicas), sort_keys=False, explicit_start=True
    )
    return header + documents
