"""Faust apps with antdt's settings, and a Faust codec that wraps the Avro codec.

The monitor runs on Faust. :func:`make_faust_app` gives it the connection and
security settings of :class:`Settings` and, with the embedded broker, the
tuning that makes a worker ready in about 2 s (docs/embedded-broker.md): short sessions,
``at_least_once`` (exactly-once does not start there), no recovery
consistency check, no waiting for empty streams, and ``broker_max_poll_interval``
left at 300 s or more (lower values hang the worker). The app runs on
:mod:`antdt.bus.faust_tuning`, which replaces Faust's fixed 1.5 s fetch
wait with antdt's, removes a per-record task race from the drain loop and
drops the per-event bookkeeping of Faust's own Monitor sensor.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from typing import Any

import faust
from faust.serializers import codecs

from antdt.bus.config import FetchPace, fetch_wait_ms
from antdt.bus.faust_tuning import QuietMonitor, TunedApp
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import AvroModel
from antdt.settings import BrokerProfile, SecurityProtocol, Settings

CODEC_NAME = "antdt-avro"

EMBEDDED_FAUST = {
    "broker_session_timeout": 2,
    "broker_heartbeat_interval": 0.2,
    "broker_rebalance_timeout": 2,
    "recovery_consistency_check": False,
    "stream_wait_empty": False,
}


class FaustAvroCodec(codecs.Codec):
    """Faust codec over antdt's Avro codec: models in, framed Avro bytes out."""

    def __init__(self, codec: Codec | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._avro = codec or make_codec()

    def _dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, AvroModel):
            raise TypeError(f"{CODEC_NAME} encodes antdt messages, got {type(obj).__name__}")
        return self._avro.encode(obj)

    def _loads(self, data: bytes) -> AvroModel:
        return self._avro.decode(data)


def register_codec(settings: Settings) -> None:
    """Register :class:`FaustAvroCodec` under ``antdt-avro`` for the settings' framing."""
    codecs.register(CODEC_NAME, FaustAvroCodec(make_codec(settings.schema_registry_url)))


def broker_urls(settings: Settings) -> list[str]:
    """Faust broker URLs for the bootstrap servers."""
    return [f"kafka://{server.strip()}" for server in settings.bootstrap_servers.split(",")]


def broker_credentials(settings: Settings) -> Any:
    """Faust credentials for the security settings, or None for PLAINTEXT."""
    context = ssl.create_default_context(
        cafile=str(settings.tls_ca_path) if settings.tls_ca_path else None
    )
    if settings.security_protocol in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL):
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password.get_secret_value() if settings.sasl_password else None,
            mechanism=settings.sasl_mechanism.value if settings.sasl_mechanism else None,
            ssl_context=context
            if settings.security_protocol is SecurityProtocol.SASL_SSL
            else None,
        )
    if settings.security_protocol is SecurityProtocol.SSL:
        return faust.SSLCredentials(context)
    return None


def _faust_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), "antdt-faust")
    os.makedirs(path, exist_ok=True)
    return path


def make_faust_app(
    settings: Settings, app_id: str, pace: FetchPace = FetchPace.STEADY, **overrides: Any
) -> faust.App:
    """A Faust app configured from settings, its fetches waiting as ``pace`` says; ``overrides``
    win over every default."""
    register_codec(settings)
    conf: dict[str, Any] = {
        "broker": broker_urls(settings),
        "broker_credentials": broker_credentials(settings),
        "broker_client_id": settings.client_id,
        "processing_guarantee": "at_least_once",
        "broker_max_poll_interval": 300.0,
        "topic_disable_leader": True,
        "consumer_auto_offset_reset": "earliest",
        "store": "memory://",
        # Faust keeps per-app files (even with the memory store) under datadir,
        # by default in the working directory; the temp dir keeps checkouts clean.
        "datadir": os.path.join(_faust_dir(), "{conf.name}-data"),
        # Faust pauses a partition when its stream buffer is 80 % full and
        # resumes it at 40 %; at the default 4096 the pauses cost about half
        # the throughput of a busy worker. Full only under a backlog, it then
        # holds ~65k events of ~1 kB each (Faust's event objects included).
        "stream_buffer_maxsize": 65536,
        "Monitor": QuietMonitor,
        "web_enabled": False,
        "key_serializer": "raw",
        "value_serializer": CODEC_NAME,
    }
    if settings.broker_profile is BrokerProfile.EMBEDDED:
        conf.update(EMBEDDED_FAUST)
    conf.update(overrides)
    return TunedApp(settings.group(app_id), fetch_max_wait_ms=fetch_wait_ms(settings, pace), **conf)


def describe_faust(app: faust.App) -> str:
    """One line: the Faust worker's group and fetch settings as the app has them (see
    :func:`antdt.bus.config.describe_profile`)."""
    conf = app.conf
    return (
        f"faust clients: broker_session_timeout={conf.broker_session_timeout:g} s, "
        f"broker_heartbeat_interval={conf.broker_heartbeat_interval:g} s, "
        f"broker_rebalance_timeout={conf.broker_rebalance_timeout:g} s, "
        f"fetch.wait.max.ms={app.fetch_max_wait_ms}"
    )


class FaustRecordSink:
    """A confluent-style ``produce()`` over a Faust app's own producer.

    Lets a Faust service write raw records (the dead-letter topic) through
    :class:`antdt.bus.deadletter.DeadLetter` without a second producer.
    """

    def __init__(self, app: faust.App):
        self._app = app
        self._topics: dict[str, Any] = {}

    def produce(
        self, topic: str, key: bytes | None = None, value: bytes | None = None, headers: Any = None
    ) -> None:
        if topic not in self._topics:
            self._topics[topic] = self._app.topic(
                topic, key_serializer="raw", value_serializer="raw"
            )
        self._topics[topic].send_soon(key=key, value=value, headers=list(headers or ()))

    def poll(self, timeout: float = 0) -> int:
        """Faust's producer delivers on its own; nothing to serve."""
        return 0
