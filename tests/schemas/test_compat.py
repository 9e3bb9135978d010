"""Schema evolution: every schema stays BACKWARD compatible with its released copy."""

from __future__ import annotations

import copy
import io

import pytest
from fastavro import schemaless_writer

from antdt.schemas.codec import SINGLE_OBJECT_MARKER, SingleObjectCodec, to_avro_dict
from antdt.schemas.examples import worker_lifecycle
from antdt.schemas.store import (
    CURRENT_DIR,
    RELEASED_DIR,
    SchemaStore,
    load_version,
    read_schema_files,
)
from tests.schemas.compat import check_all, check_backward

CURRENT = read_schema_files(CURRENT_DIR)
RELEASED = read_schema_files(RELEASED_DIR)


def test_every_current_schema_has_a_released_copy():
    assert sorted(CURRENT) == sorted(RELEASED)


@pytest.mark.parametrize("report", check_all(), ids=lambda r: r.name)
def test_current_is_backward_compatible_with_released(report):
    assert report.compatible, "; ".join(report.problems)


def _lifecycle() -> dict:
    return copy.deepcopy(CURRENT["WorkerLifecycle"])


def _field(schema: dict, name: str) -> dict:
    return next(f for f in schema["fields"] if f["name"] == name)


def test_adding_a_field_with_a_default_is_compatible():
    new = _lifecycle()
    new["fields"].append({"name": "zone", "type": ["null", "string"], "default": None, "doc": "d"})
    assert check_backward(new, CURRENT["WorkerLifecycle"]).compatible


@pytest.mark.parametrize(
    "mutation",
    ["field without default", "type change", "enum symbol removed", "nullable made required"],
)
def test_incompatible_changes_fail_the_check(mutation):
    new = _lifecycle()
    if mutation == "field without default":
        new["fields"].append({"name": "zone", "type": "string", "doc": "d"})
    elif mutation == "type change":
        _field(new, "pid")["type"] = "string"
    elif mutation == "enum symbol removed":
        _field(new, "event")["type"]["symbols"].remove("HEARTBEAT")
    else:
        field = _field(new, "rank")
        field["type"] = "int"
        del field["default"]
    report = check_backward(new, CURRENT["WorkerLifecycle"])
    assert not report.compatible and report.problems


def test_data_written_by_an_older_schema_decodes_with_the_current_one():
    """A writer on an older release (no node_id field) is read by today's codec."""
    old = _lifecycle()
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("node_id", "reason")]
    old_version = load_version(old, current=False)
    current_version = load_version(CURRENT["WorkerLifecycle"], current=True)
    codec = SingleObjectCodec(SchemaStore([current_version, old_version]))
    record = {
        k: v for k, v in to_avro_dict(worker_lifecycle()).items() if k not in ("node_id", "reason")
    }
    buffer = io.BytesIO(SINGLE_OBJECT_MARKER + old_version.fingerprint)
    buffer.seek(0, io.SEEK_END)
    schemaless_writer(buffer, old_version.parsed, record)
    decoded = codec.decode(buffer.getvalue())
    assert decoded.node_id is None and decoded.reason is None
    assert decoded.worker_id == record["worker_id"] and decoded.pid == record["pid"]
