"""Codec: round trips, interoperability with reference libraries, and clean failures."""

from __future__ import annotations

import io
import json
import socket
from datetime import datetime

import avro.io
import avro.schema
import orjson
import pytest
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from antdt.errors import CodecError, UnknownSchemaError
from antdt.schemas.codec import (
    REGISTRY_TIMEOUT_S,
    SINGLE_OBJECT_MARKER,
    ConfluentCodec,
    SingleObjectCodec,
    make_codec,
    registry_client_conf,
    to_avro_dict,
    to_json,
)
from antdt.schemas.examples import all_examples, worker_metrics
from antdt.schemas.models import AvroModel
from antdt.schemas.store import CURRENT_DIR, crc64_avro, default_store, read_schema_files

EXAMPLES = all_examples()
IDS = [type(m).__name__ for m in EXAMPLES]
SCHEMA_FILES = read_schema_files(CURRENT_DIR)


def reference_schema(message: AvroModel) -> avro.schema.Schema:
    """The schema parsed by Apache avro from the .avsc file alone."""
    return avro.schema.parse(json.dumps(SCHEMA_FILES[type(message).__name__]))


def spec_fingerprint(schema: avro.schema.Schema) -> bytes:
    """CRC-64-AVRO of the Parsing Canonical Form as the spec and Java define it.

    The Python avro package leaves logical types as ``{"type":"long"}`` in its
    canonical form; the [PRIMITIVES] rule (and Java) write plain ``"long"``.
    """
    canonical = schema.canonical_form.replace('{"type":"long"}', '"long"').replace(
        '{"type":"int"}', '"int"'
    )
    return avro.schema.parse(canonical).fingerprint("CRC-64-AVRO")


@pytest.mark.parametrize("message", EXAMPLES, ids=IDS)
def test_single_object_round_trip(message):
    codec = SingleObjectCodec()
    assert codec.decode(codec.encode(message)) == message


@pytest.mark.parametrize("message", EXAMPLES, ids=IDS)
def test_reference_avro_library_decodes_our_bytes(message):
    data = SingleObjectCodec().encode(message)
    schema = reference_schema(message)
    assert data[:2] == SINGLE_OBJECT_MARKER
    assert data[2:10] == spec_fingerprint(schema)
    decoder = avro.io.BinaryDecoder(io.BytesIO(data[10:]))
    record = avro.io.DatumReader(schema).read(decoder)
    assert type(message).model_validate(record) == message


@pytest.mark.parametrize("message", EXAMPLES, ids=IDS)
def test_we_decode_the_reference_library_bytes(message):
    schema = reference_schema(message)
    buffer = io.BytesIO()
    buffer.write(SINGLE_OBJECT_MARKER + spec_fingerprint(schema))
    avro.io.DatumWriter(schema).write(
        message.model_dump(mode="python"), avro.io.BinaryEncoder(buffer)
    )
    assert SingleObjectCodec().decode(buffer.getvalue()) == message


def test_fingerprint_matches_the_specification_example():
    # CRC-64-AVRO of the canonical form of "string", per the reference library.
    assert crc64_avro(b'"string"') == avro.schema.parse('"string"').fingerprint("CRC-64-AVRO")


@pytest.mark.parametrize("message", EXAMPLES, ids=IDS)
def test_confluent_wire_format_round_trip_and_interop(message):
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    writer = ConfluentCodec(f"mock://test-{type(message).__name__}")
    encoded = writer.encode(message, "antdt.any")
    assert encoded[0] == 0
    # a fresh codec resolves the id through the registry
    reader = ConfluentCodec(client=writer.client)
    assert reader.decode(encoded) == message
    deserializer = AvroDeserializer(writer.client)
    record = deserializer(encoded, SerializationContext("antdt.any", MessageField.VALUE))
    assert type(message).model_validate(record) == message


def test_make_codec_follows_the_registry_setting():
    assert isinstance(make_codec(None), SingleObjectCodec)
    assert isinstance(make_codec("mock://x"), ConfluentCodec)


def test_json_output_is_plain_json():
    rendered = orjson.loads(to_json(worker_metrics()))
    assert rendered["worker_id"] == "worker-3"
    assert rendered["compute"]["p90_s"] == 0.109
    assert datetime.fromisoformat(rendered["window_end"]).tzinfo is not None


def test_not_single_object_is_rejected():
    with pytest.raises(CodecError, match="C3 01 marker"):
        SingleObjectCodec().decode(b'{"json": true}')


def test_unknown_fingerprint_is_rejected():
    with pytest.raises(UnknownSchemaError, match="unknown writer schema fingerprint"):
        SingleObjectCodec().decode(SINGLE_OBJECT_MARKER + b"\x00" * 8 + b"\x02")


def test_truncated_body_is_rejected():
    data = SingleObjectCodec().encode(worker_metrics())
    with pytest.raises(CodecError, match="corrupt antdt.WorkerMetrics body"):
        SingleObjectCodec().decode(data[:-20])


def test_trailing_bytes_are_rejected():
    data = SingleObjectCodec().encode(worker_metrics())
    with pytest.raises(CodecError, match="trailing bytes"):
        SingleObjectCodec().decode(data + b"\x00")


def test_schema_valid_but_meaningless_record_is_rejected():
    """A negative duration passes Avro but not the model: it must not reach a service."""
    record = to_avro_dict(worker_metrics())
    record["data_wait_s"] = -1.0
    version = default_store().current("antdt.WorkerMetrics")
    buffer = io.BytesIO()
    buffer.write(SINGLE_OBJECT_MARKER + version.fingerprint)
    schemaless_writer(buffer, version.parsed, record)
    with pytest.raises(CodecError, match="invalid antdt.WorkerMetrics: data_wait_s"):
        SingleObjectCodec().decode(buffer.getvalue())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_escape_as_anything_but_codec_error(data):
    try:
        SingleObjectCodec().decode(data)
    except CodecError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_corrupted_messages_decode_or_fail_cleanly(data):
    message = data.draw(st.sampled_from(EXAMPLES))
    encoded = bytearray(SingleObjectCodec().encode(message))
    position = data.draw(st.integers(10, len(encoded) - 1))
    encoded[position] = data.draw(st.integers(0, 255))
    try:
        decoded = SingleObjectCodec().decode(bytes(encoded))
    except CodecError:
        return
    assert isinstance(decoded, type(message))


@settings(max_examples=200, deadline=None)
@given(
    seq=st.integers(0, 2**63 - 1),
    steps=st.integers(0, 10_000),
    first=st.integers(0, 2**40),
    times=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=4, max_size=4),
    batch=st.integers(0, 2**31 - 1),
    gpu=st.none() | st.floats(0, 100),
)
def test_worker_metrics_round_trip_property(seq, steps, first, times, batch, gpu):
    low, p50, p90, high = sorted(times)
    base = worker_metrics()
    message = base.model_copy(
        update={
            "seq": seq,
            "step_count": steps,
            "first_step": first if steps else None,
            "last_step": first + steps - 1 if steps else None,
            "local_batch_size": batch,
            "compute": base.compute.model_copy(
                update={"sum_s": high * 4, "min_s": low, "p50_s": p50, "p90_s": p90, "max_s": high}
            ),
            "resources": base.resources.model_copy(update={"gpu_utilization_percent": gpu}),
        }
    )
    message = type(message).model_validate(message.model_dump())
    assert SingleObjectCodec().decode(SingleObjectCodec().encode(message)) == message


def test_every_registry_request_is_bounded_unless_told_otherwise():
    conf = registry_client_conf("http://registry:8081")
    assert conf == {"url": "http://registry:8081", "timeout": REGISTRY_TIMEOUT_S}
    assert registry_client_conf("http://registry:8081", {"timeout": 2.5})["timeout"] == 2.5


def test_a_registry_that_never_answers_fails_the_decode_naming_it_without_its_credentials():
    """A registry that takes the connection and says nothing (a half-open connection, a stalled
    proxy) ends the lookup at the request's bound (0.3 s here, no retries)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        codec = ConfluentCodec(
            f"http://user:secret@127.0.0.1:{port}", registry_conf={"timeout": 0.3, "max.retries": 0}
        )
        with pytest.raises(
            CodecError, match=rf"could not be read from http://127.0.0.1:{port}"
        ) as refused:
            codec.decode(b"\x00\x00\x00\x00\x07" + b"\x02")
    assert "secret" not in str(refused.value)
