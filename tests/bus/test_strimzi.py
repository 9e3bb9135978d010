"""The Strimzi KafkaTopic file is generated from the registry, and the committed copy is current."""

from __future__ import annotations

import pytest
import yaml

from antdt.bus.strimzi import kafka_topics, kafka_topics_yaml, resource_name
from antdt.cli.main import run
from antdt.topics import TOPICS
from tests.deploy.k8s_schemas import REPO, schema_errors

COMMITTED = REPO / "deploy" / "k8s" / "components" / "strimzi" / "topics.yaml"


def test_committed_topics_file_is_the_generator_output():
    assert COMMITTED.read_text() == kafka_topics_yaml(), (
        f"{COMMITTED.relative_to(REPO)} is stale: regenerate it with "
        f"`antdt topics --kafka-topics > {COMMITTED.relative_to(REPO)}`"
    )


def test_cli_prints_the_generator_output(capsys):
    assert run(["topics", "--kafka-topics", "--cluster", "kafka-a", "--replicas", "2"]) == 0
    assert capsys.readouterr().out == kafka_topics_yaml(cluster="kafka-a", replicas=2)


def test_cli_uses_the_topic_prefix_setting(capsys, monkeypatch):
    monkeypatch.setenv("ANTDT_TOPIC_PREFIX", "team1")
    assert run(["topics", "--kafka-topics"]) == 0
    names = {doc["metadata"]["name"] for doc in yaml.safe_load_all(capsys.readouterr().out)}
    assert names == {spec.full_name("team1") for spec in TOPICS}


def test_one_topic_per_registry_entry_with_its_partitions_and_configs():
    topics = kafka_topics("antdt", "c1", 3)
    assert [t["metadata"]["name"] for t in topics] == [spec.full_name("antdt") for spec in TOPICS]
    for topic, spec in zip(topics, TOPICS):
        assert topic["spec"] == {
            "partitions": spec.partitions,
            "replicas": 3,
            "config": spec.configs,
        }
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "c1"
        assert not schema_errors(topic), schema_errors(topic)


def test_dead_letter_topic_is_included():
    assert "antdt.deadletter" in {t["metadata"]["name"] for t in kafka_topics()}


def test_a_prefix_kubernetes_cannot_name_goes_to_topic_name():
    """Kafka allows `_` and capitals in topic names, Kubernetes object names do not."""
    topic = kafka_topics("My_Team", "c1", 1)[0]
    assert topic["metadata"]["name"] == "my-team.worker.metrics"
    assert topic["spec"]["topicName"] == "My_Team.worker.metrics"
    assert resource_name("a_b.C") == "a-b.c"


def test_replicas_below_one_are_refused():
    with pytest.raises(ValueError, match="replicas"):
        kafka_topics(replicas=0)
