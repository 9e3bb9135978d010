"""The one settings object, read from ``ANTDT_*`` environment variables.

Every service, the agent and the CLI take their configuration from
:class:`Settings`. Security settings are passed through to the Kafka clients
(see :mod:`antdt.bus.config`). A bad value never surfaces as a pydantic
traceback: :func:`load_settings` turns it into a one-line :class:`ConfigError`
that names the environment variable.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from antdt.errors import ConfigError

ENV_PREFIX = "ANTDT_"
#: What an id (job, worker, topic prefix, client) may look like.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class SecurityProtocol(str, Enum):
    """Kafka ``security.protocol`` values."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(str, Enum):
    """SASL mechanisms both librdkafka and aiokafka (Faust) speak."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class BrokerProfile(str, Enum):
    """Which broker the clients are tuned for.

    ``kafka`` keeps librdkafka's and Faust's production defaults. ``embedded``
    applies the short session timeouts and fetch waits measured against the
    embedded Tansu broker (see docs/embedded-broker.md), where group joins are otherwise
    held for half the session timeout.
    """

    KAFKA = "kafka"
    EMBEDDED = "embedded"


class Settings(BaseSettings):
    """antdt configuration. Each field is read from ``ANTDT_<FIELD NAME>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    bootstrap_servers: str = Field(
        "localhost:9092", min_length=1, description="Kafka bootstrap servers, host:port[,host:port]"
    )
    broker_profile: BrokerProfile = Field(
        BrokerProfile.KAFKA, description="client tuning: kafka or embedded"
    )
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    tls_ca_path: Path | None = Field(
        None, description="CA bundle to verify the brokers' certificates"
    )
    schema_registry_url: str | None = Field(
        None, description="Confluent schema registry; unset = Avro single-object encoding"
    )
    job_id: str = Field("default", pattern=NAME_PATTERN, max_length=128)
    topic_prefix: str = Field("antdt", pattern=NAME_PATTERN, max_length=64)
    report_interval_s: float = Field(1.0, gt=0, le=3600)
    signing_key: SecretStr | None = Field(
        None, description="HMAC-SHA256 key for command signatures"
    )
    control_key: SecretStr | None = Field(
        None, description="HMAC-SHA256 key for control changes (operators and services only)"
    )
    control_previous_key: SecretStr | None = Field(
        None, description="the control key being rotated out: still accepted, never used to sign"
    )
    client_id: str = Field("antdt", pattern=NAME_PATTERN, max_length=128)
    worker_id: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=128,
        description="agent identity; default rank-<RANK>",
    )
    node_id: str | None = Field(
        None, max_length=256, description="node the agent runs on; default the host name"
    )
    heartbeat_interval_s: float = Field(5.0, gt=0, le=3600)
    agent_metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="the agent's Prometheus /metrics port, plus LOCAL_RANK; unset: off, 0: any",
    )
    checkpoint_every_s: float = Field(
        30.0, gt=0, description="how often a synchronous job (ElasticJob) checkpoints"
    )
    pause_limit_s: float = Field(
        600.0,
        gt=0,
        description="the longest a PAUSE holds a worker's training without a RESUME",
    )
    ps_servers: str | None = Field(
        None,
        description="asynchronous training: the job's parameter-server shards, host:port,... in "
        "shard order (antdt up --mode async prints them)",
    )
    slowdown: str | None = Field(
        None, description="straggler injection: a factor, or episodes start-end:factor,..."
    )
    slowdown_mode: str = Field(
        "sleep", pattern=r"^(sleep|cpu)$", description="sleep, or cpu (busy competitor processes)"
    )
    slowdown_ranks: str | None = Field(
        None,
        pattern=r"^\d+(,\d+)*$",
        description="the ranks (RANK) the slowdown applies to, e.g. 2 or 0,3; default all",
    )

    @property
    def slowed_ranks(self) -> frozenset[int] | None:
        """The ranks ``slowdown`` applies to; None: every process given it."""
        return (
            frozenset(int(r) for r in self.slowdown_ranks.split(","))
            if self.slowdown_ranks
            else None
        )

    @field_validator("bootstrap_servers", "ps_servers")
    @classmethod
    def _check_addresses(cls, value: str | None) -> str | None:
        for server in value.split(",") if value is not None else ():
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port[,host:port], got {server.strip()!r}")
        return value

    @field_validator("tls_ca_path")
    @classmethod
    def _check_ca_path(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("schema_registry_url")
    @classmethod
    def _check_registry_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "mock://")):
            raise ValueError(f"expected an http(s):// URL, got {value!r}")
        return value

    @field_validator("slowdown")
    @classmethod
    def _check_slowdown(cls, value: str | None) -> str | None:
        if value:
            from antdt.worker.injection import parse_slowdown

            parse_slowdown(value)  # raises a one-line error naming what is wrong
        return value or None

    @model_validator(mode="after")
    def _check_sasl(self) -> Settings:
        uses_sasl = self.security_protocol in (
            SecurityProtocol.SASL_PLAINTEXT,
            SecurityProtocol.SASL_SSL,
        )
        if uses_sasl and (
            self.sasl_mechanism is None or not self.sasl_username or self.sasl_password is None
        ):
            raise ValueError(
                f"security_protocol {self.security_protocol.value} needs sasl_mechanism, "
                "sasl_username and sasl_password"
            )
        return self

    def topic(self, component: str, name: str) -> str:
        """Full topic name ``<prefix>.<component>.<name>``."""
        return f"{self.topic_prefix}.{component}.{name}"

    def group(self, service: str) -> str:
        """A service's consumer group (a Faust app's id), ``<prefix>.<service>``: its instances
        split its input by it, and others read its committed offsets by it (lag, what it read)."""
        return f"{self.topic_prefix}.{service}"


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment (and ``overrides``), or raise a one-line ConfigError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None


def describe_validation_error(exc: ValidationError, prefix: str = ENV_PREFIX) -> str:
    """One line naming the first offending ``<prefix>*`` variable and what is wrong with it."""
    error = exc.errors()[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    variable = f"{prefix}{field.upper()}" if field else "ANTDT settings"
    message = error["msg"].removeprefix("Value error, ")
    shown = error.get("input")
    suffix = (
        "" if not field or isinstance(shown, dict) or _is_secret(field) else f" (got {shown!r})"
    )
    more = len(exc.errors()) - 1
    tail = f" [and {more} more]" if more else ""
    return f"{variable}: {message}{suffix}{tail}"


def _is_secret(field: str) -> bool:
    return field in ("sasl_password", "signing_key", "control_key", "control_previous_key")
