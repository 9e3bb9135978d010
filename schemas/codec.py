"""Encoding and decoding of antdt messages.

Two framings, one interface (:class:`Codec`):

* :class:`SingleObjectCodec` (default): Avro single-object encoding, i.e.
  ``C3 01`` + the 8-byte CRC-64-AVRO fingerprint of the writer schema + the
  Avro binary body. The fingerprint is taken over the Parsing Canonical Form
  as Java's ``SchemaNormalization`` (and fastavro) compute it, where a
  logical type reduces to its primitive (``"long"``); the Python ``avro``
  package keeps a ``{"type": "long"}`` wrapper there, so its ``fingerprint()``
  differs for schemas with logical types. No registry is needed and every message names its schema,
  so any Avro library can decode it given the ``.avsc`` files.
* :class:`ConfluentCodec`: the Confluent wire format (``00`` + 4-byte schema
  id + body) through ``confluent_kafka.schema_registry``, for sites that run a
  schema registry. Subjects follow the record name, so one topic may carry
  several record types.

Decoding resolves the writer schema to the current one (Avro schema
resolution), so data written by an older release still decodes. Any failure,
including a record that decodes but fails the model's semantic checks, raises
:class:`CodecError`: services route those to the dead-letter topic.
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson
from fastavro import schemaless_reader, schemaless_writer
from pydantic import ValidationError

from antdt.errors import CodecError, SchemaError
from antdt.schemas.models import MESSAGE_TYPES, AvroModel
from antdt.schemas.store import SchemaStore, SchemaVersion, default_store

SINGLE_OBJECT_MARKER = b"\xc3\x01"
_HEADER_LEN = len(SINGLE_OBJECT_MARKER) + 8
_MODELS_BY_NAME: dict[str, type[AvroModel]] = {m.avro_name: m for m in MESSAGE_TYPES}


class Codec(Protocol):
    """Turns a message model into bytes and back."""

    def encode(self, message: AvroModel, topic: str | None = None) -> bytes: ...

    def decode(self, data: bytes, topic: str | None = None) -> AvroModel: ...


def model_for(name: str) -> type[AvroModel]:
    """The model class of a top-level record name (``antdt.WorkerMetrics``)."""
    try:
        return _MODELS_BY_NAME[name]
    except KeyError:
        raise SchemaError(f"{name!r} is not an antdt message type") from None


def to_avro_dict(message: AvroModel) -> dict[str, Any]:
    """The record as the plain dict fastavro writes (enums stay str-valued members)."""
    return message.model_dump(mode="python")


def from_avro_dict(name: str, record: dict[str, Any]) -> AvroModel:
    """Validate a decoded record into its model; semantic errors become CodecError."""
    try:
        return model_for(name).model_validate(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or name
        raise CodecError(f"invalid {name}: {where}: {first['msg']}") from None


def to_json(message: AvroModel) -> bytes:
    """JSON rendering of a message for people and tools (not a wire format)."""
    return orjson.dumps(message.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


class SingleObjectCodec:
    """Avro single-object encoding; needs nothing but the schemas in the package."""

    def __init__(self, store: SchemaStore | None = None):
        self._store = store or default_store()

    def encode(self, message: AvroModel, topic: str | None = None) -> bytes:
        version = self._store.current(message.avro_name)
        buffer = io.BytesIO()
        buffer.write(SINGLE_OBJECT_MARKER)
        buffer.write(version.fingerprint)
        try:
            schemaless_writer(buffer, version.parsed, to_avro_dict(message))
        except (ValueError, TypeError, OverflowError) as exc:
            raise CodecError(f"cannot encode {message.avro_name}: {exc}") from exc
        return buffer.getvalue()

    def decode(self, data: bytes, topic: str | None = None) -> AvroModel:
        writer = self.writer_of(data)
        reader = self._store.current(writer.name)
        record = _read_body(data[_HEADER_LEN:], writer, reader)
        return from_avro_dict(writer.name, record)

    def writer_of(self, data: bytes) -> SchemaVersion:
        """The writer schema a single-object message names in its header."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CodecError(f"expected bytes, got {type(data).__name__}")
        if len(data) < _HEADER_LEN or bytes(data[:2]) != SINGLE_OBJECT_MARKER:
            raise CodecError("not Avro single-object encoded (missing C3 01 marker)")
        return self._store.by_fingerprint(bytes(data[2:_HEADER_LEN]))


def _read_body(body: bytes, writer: SchemaVersion, reader: SchemaVersion) -> dict[str, Any]:
    """Decode an Avro body, resolving writer to reader schema; all of it must be consumed."""
    stream = io.BytesIO(body)
    reader_schema = None if writer is reader else reader.parsed
    try:
        record = schemaless_reader(stream, writer.parsed, reader_schema)
    except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, ...
        raise CodecError(f"corrupt {writer.name} body: {type(exc).__name__}: {exc}") from None
    if stream.tell() != len(body):
        raise CodecError(f"{len(body) - stream.tell()} trailing bytes after {writer.name} body")
    return record


#: How long one request to the schema registry may take (the client's default is no bound: a
#: registry that takes a connection and never answers would hold a service's loop for good).
REGISTRY_TIMEOUT_S = 10.0


def registry_client_conf(registry_url: str | None, overrides: dict | None = None) -> dict:
    """The registry client's configuration: ``registry_url``, each request bounded, then
    ``overrides``."""
    return {"url": registry_url, "timeout": REGISTRY_TIMEOUT_S, **(overrides or {})}


def shown_url(url: str) -> str:
    """``url`` without any credentials in it, for a message."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


class ConfluentCodec:
    """Confluent wire format through ``confluent_kafka.schema_registry``.

    Encoding uses the library's ``AvroSerializer`` (auto-registering the
    current schema under the record-name subject, so one topic can carry
    several record types). Decoding reads the schema id, fetches the writer
    schema from the registry once, and resolves it to the current schema,
    so any registered version decodes.
    """

    def __init__(
        self,
        registry_url: str | None = None,
        store: SchemaStore | None = None,
        registry_conf: dict | None = None,
        client: Any = None,
    ):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        if client is None and registry_url is None:
            raise SchemaError("ConfluentCodec needs a registry URL or a registry client")
        self._store = store or default_store()
        self.registry = shown_url(registry_url) if registry_url else "the registry client given"
        self.client = client or SchemaRegistryClient.new_client(
            registry_client_conf(registry_url, registry_conf)
        )
        self._serializers: dict[str, Any] = {}
        self._writers: dict[int, SchemaVersion] = {}

    def encode(self, message: AvroModel, topic: str | None = None) -> bytes:
        from confluent_kafka.serialization import MessageField, SerializationContext

        serializer = self._serializers.get(message.avro_name) or self._serializer_for(
            message.avro_name
        )
        try:
            return serializer(message, SerializationContext(topic or "", MessageField.VALUE))
        except Exception as exc:  # the serializer wraps every failure in its own types
            raise CodecError(f"cannot encode {message.avro_name}: {exc}") from exc

    def decode(self, data: bytes, topic: str | None = None) -> AvroModel:
        if len(data) < 5 or data[0] != 0:
            raise CodecError("not in Confluent wire format (missing magic byte 0)")
        (schema_id,) = struct.unpack(">I", data[1:5])
        writer = self._writers.get(schema_id) or self._lookup(schema_id)
        reader = self._store.current(writer.name)
        return from_avro_dict(writer.name, _read_body(bytes(data[5:]), writer, reader))

    def _serializer_for(self, name: str) -> Any:
        from confluent_kafka.schema_registry import record_subject_name_strategy
        from confluent_kafka.schema_registry.avro import AvroSerializer

        version = self._store.current(name)
        serializer = AvroSerializer(
            self.client,
            json.dumps(version.raw),
            to_dict=lambda message, _ctx: to_avro_dict(message),
            conf={
                "auto.register.schemas": True,
                "subject.name.strategy": record_subject_name_strategy,
            },
        )
        self._serializers[name] = serializer
        return serializer

    def _lookup(self, schema_id: int) -> SchemaVersion:
        from antdt.schemas.store import load_version

        try:
            registered = self.client.get_schema(schema_id)
        except Exception as exc:
            raise CodecError(
                f"schema id {schema_id} could not be read from {self.registry}: {exc}"
            ) from None
        version = load_version(json.loads(registered.schema_str), current=False)
        self._writers[schema_id] = version
        return version


def make_codec(registry_url: str | None = None) -> Codec:
    """The codec the settings ask for: Confluent framing with a registry, single-object without."""
    return ConfluentCodec(registry_url) if registry_url else SingleObjectCodec()
