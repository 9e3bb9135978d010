"""Settings: environment parsing and one-line errors naming the variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from antdt.errors import ConfigError
from antdt.settings import (
    ENV_PREFIX,
    BrokerProfile,
    SaslMechanism,
    SecurityProtocol,
    Settings,
    load_settings,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def test_defaults_need_no_environment():
    settings = load_settings()
    assert settings.bootstrap_servers == "localhost:9092"
    assert settings.topic_prefix == "antdt"
    assert settings.report_interval_s == 1.0
    assert settings.broker_profile is BrokerProfile.KAFKA
    assert settings.topic("worker", "metrics") == "antdt.worker.metrics"


def test_values_come_from_antdt_variables(monkeypatch, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    monkeypatch.setenv("ANTDT_BOOTSTRAP_SERVERS", "k1:9093,k2:9093")
    monkeypatch.setenv("ANTDT_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("ANTDT_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("ANTDT_SASL_USERNAME", "trainer")
    monkeypatch.setenv("ANTDT_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("ANTDT_TLS_CA_PATH", str(ca))
    monkeypatch.setenv("ANTDT_SCHEMA_REGISTRY_URL", "https://registry:8081")
    monkeypatch.setenv("ANTDT_JOB_ID", "resnet-42")
    monkeypatch.setenv("ANTDT_REPORT_INTERVAL_S", "0.5")
    monkeypatch.setenv("ANTDT_SIGNING_KEY", "k" * 32)
    settings = load_settings()
    assert settings.bootstrap_servers == "k1:9093,k2:9093"
    assert settings.security_protocol is SecurityProtocol.SASL_SSL
    assert settings.sasl_mechanism is SaslMechanism.SCRAM_SHA_512
    assert settings.sasl_password.get_secret_value() == "s3cret"
    assert settings.tls_ca_path == ca
    assert settings.job_id == "resnet-42"
    assert settings.report_interval_s == 0.5
    assert settings.signing_key.get_secret_value() == "k" * 32


def test_secrets_never_appear_in_repr(monkeypatch):
    monkeypatch.setenv("ANTDT_SIGNING_KEY", "very-secret-key")
    monkeypatch.setenv("ANTDT_SASL_PASSWORD", "hunter2")
    text = repr(load_settings()) + str(load_settings())
    assert "very-secret-key" not in text and "hunter2" not in text


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ANTDT_BOOTSTRAP_SERVERS", "no-port-here", "expected host:port"),
        ("ANTDT_BOOTSTRAP_SERVERS", "host:99999", "expected host:port"),
        ("ANTDT_REPORT_INTERVAL_S", "-1", "greater than 0"),
        ("ANTDT_REPORT_INTERVAL_S", "fast", "valid number"),
        ("ANTDT_TOPIC_PREFIX", "has space", "match pattern"),
        ("ANTDT_JOB_ID", "", "match pattern"),
        ("ANTDT_SECURITY_PROTOCOL", "TLS", "PLAINTEXT"),
        ("ANTDT_SASL_MECHANISM", "GSSAPI", "SCRAM-SHA-256"),
        ("ANTDT_TLS_CA_PATH", "/nonexistent/ca.pem", "no such file"),
        ("ANTDT_SCHEMA_REGISTRY_URL", "ftp://registry", "http(s)://"),
        ("ANTDT_BROKER_PROFILE", "tansu", "embedded"),
    ],
)
def test_bad_value_is_one_line_naming_the_variable(monkeypatch, variable, value, expected):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"{variable}: ")
    assert expected in message
    assert "\n" not in message


def test_sasl_without_credentials_is_refused(monkeypatch):
    monkeypatch.setenv("ANTDT_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    with pytest.raises(ConfigError, match="needs sasl_mechanism, sasl_username and sasl_password"):
        load_settings()


def test_bad_secret_value_is_not_echoed(monkeypatch):
    monkeypatch.setenv("ANTDT_SIGNING_KEY", "")
    monkeypatch.setenv("ANTDT_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("ANTDT_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "hunter2" not in str(caught.value)


def test_the_readme_table_names_every_setting_and_nothing_else():
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `ANTDT_")]
    documented = {
        name
        for row in rows
        for name in re.findall(r"`(ANTDT_[A-Z0-9_]+)`", row.split(" | ")[0])
        if not name.startswith("ANTDT_K8S_")  # the controller's own (KubernetesSettings)
    }
    fields = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    assert documented == fields
