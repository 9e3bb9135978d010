"""Models and .avsc schemas agree, field by field; every field is documented.

The ``.avsc`` files are what other teams consume; the models are what antdt
writes. A field renamed, retyped, made nullable or given a different default
on one side only fails here.
"""

from __future__ import annotations

import types
import typing
from datetime import datetime
from enum import Enum
from typing import Any, Union

import fastavro
import pytest
from pydantic import BaseModel

from antdt.schemas.models import MESSAGE_TYPES, AvroRecord
from antdt.schemas.store import CURRENT_DIR, read_schema_files
from antdt.schemas.types import AvroType

SCHEMAS = read_schema_files(CURRENT_DIR)
PRIMITIVES = {str: "string", bool: "boolean", bytes: "bytes", float: "double"}
_NO_DEFAULT = object()


def expected_avro(annotation: Any, metadata: list[Any] = ()) -> Any:
    """The Avro type a model annotation must map to, in normalised form."""
    tags = [m for m in metadata if isinstance(m, AvroType)]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return expected_avro(base, [*metadata, *extra])
    if origin in (Union, types.UnionType):
        args = typing.get_args(annotation)
        assert len(args) == 2 and type(None) in args, (
            f"only Optional unions are allowed, got {annotation}"
        )
        inner = next(a for a in args if a is not type(None))
        return ["null", expected_avro(inner, metadata)]
    if origin is list:
        return {"type": "array", "items": expected_avro(typing.get_args(annotation)[0])}
    if origin is dict:
        key, value = typing.get_args(annotation)
        assert key is str, "Avro map keys are strings"
        return {"type": "map", "values": expected_avro(value)}
    if tags:
        name = tags[-1].name
        return {"type": "long", "logicalType": name} if name == "timestamp-millis" else name
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return {
            "type": "enum",
            "name": annotation.__name__,
            "symbols": [m.value for m in annotation],
        }
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {
            "type": "record",
            "name": annotation.avro_name.rsplit(".", 1)[-1],
            "model": annotation,
        }
    assert annotation is not int, (
        "an int field must say int or long (use the aliases in antdt.schemas.types)"
    )
    assert annotation is not datetime, "a datetime field must use the Timestamp alias"
    return PRIMITIVES[annotation]


def normalised(schema: Any) -> Any:
    """A schema type reduced to what the comparison looks at."""
    if isinstance(schema, list):
        return [normalised(s) for s in schema]
    if isinstance(schema, str):
        return schema
    kind = schema["type"]
    if isinstance(kind, (dict, list)):
        return normalised(kind)
    if kind == "long" and "logicalType" in schema:
        return {"type": "long", "logicalType": schema["logicalType"]}
    if kind == "enum":
        return {"type": "enum", "name": schema["name"], "symbols": schema["symbols"]}
    if kind == "array":
        return {"type": "array", "items": normalised(schema["items"])}
    if kind == "map":
        return {"type": "map", "values": normalised(schema["values"])}
    if kind == "record":
        return {"type": "record", "name": schema["name"], "schema": schema}
    return kind


def assert_same_type(expected: Any, actual: Any, where: str) -> None:
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (
            f"{where}: {actual} != {expected}"
        )
        for e, a in zip(expected, actual):
            assert_same_type(e, a, where)
    elif isinstance(expected, dict) and expected["type"] == "record":
        assert isinstance(actual, dict) and actual.get("type") == "record", (
            f"{where}: expected a record"
        )
        assert actual["name"] == expected["name"], (
            f"{where}: record {actual['name']} != {expected['name']}"
        )
        assert_record_matches(expected["model"], actual["schema"], where)
    elif isinstance(expected, dict) and expected["type"] in ("array", "map"):
        key = "items" if expected["type"] == "array" else "values"
        assert isinstance(actual, dict) and actual["type"] == expected["type"], (
            f"{where}: {actual} != {expected}"
        )
        assert_same_type(expected[key], actual[key], f"{where}[]")
    else:
        assert actual == expected, f"{where}: schema says {actual}, model says {expected}"


def schema_default(field: dict[str, Any]) -> Any:
    return field.get("default", _NO_DEFAULT)


def model_default(info) -> Any:
    if info.is_required():
        return _NO_DEFAULT
    return info.default_factory() if info.default_factory is not None else info.default


def assert_record_matches(model: type[BaseModel], schema: dict[str, Any], where: str) -> None:
    assert schema.get("doc"), f"{where}: record {schema['name']} has no doc"
    schema_fields = [f["name"] for f in schema["fields"]]
    assert list(model.model_fields) == schema_fields, f"{where}: field names/order differ"
    for field in schema["fields"]:
        path = f"{where}.{field['name']}"
        info = model.model_fields[field["name"]]
        assert field.get("doc"), f"{path} has no doc"
        assert_same_type(
            expected_avro(info.annotation, info.metadata), normalised(field["type"]), path
        )
        assert schema_default(field) == model_default(info), f"{path}: default differs"


@pytest.mark.parametrize("model", MESSAGE_TYPES, ids=lambda m: m.__name__)
def test_model_matches_schema(model):
    schema = SCHEMAS[model.__name__]
    assert f"{schema['namespace']}.{schema['name']}" == model.avro_name
    assert_record_matches(model, schema, model.__name__)


def test_every_schema_has_a_model():
    assert sorted(SCHEMAS) == sorted(m.__name__ for m in MESSAGE_TYPES)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_parses_with_fastavro(name):
    fastavro.parse_schema(SCHEMAS[name])


def _named_types(schema: Any, found: dict[str, list[Any]]) -> None:
    if isinstance(schema, list):
        for item in schema:
            _named_types(item, found)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed"):
            found.setdefault(f"{schema.get('namespace', 'antdt')}.{schema['name']}", []).append(
                schema
            )
        for value in schema.values():
            if isinstance(value, (dict, list)):
                _named_types(value, found)


def test_shared_named_types_are_identical_across_files():
    found: dict[str, list[Any]] = {}
    for schema in SCHEMAS.values():
        _named_types(schema, found)
    for name, definitions in found.items():
        assert all(d == definitions[0] for d in definitions), (
            f"{name} is defined differently in different files"
        )


def test_nested_records_have_models():
    nested = {cls.avro_name for cls in AvroRecord.__subclasses__()}
    found: dict[str, list[Any]] = {}
    for schema in SCHEMAS.values():
        _named_types(schema, found)
    records = {n for n, d in found.items() if d[0]["type"] == "record"}
    assert records - {m.avro_name for m in MESSAGE_TYPES} == nested


def _mutated_lifecycle(**changes: Any) -> type[BaseModel]:
    """WorkerLifecycle with some fields re-declared, to prove the checker bites."""
    from pydantic import create_model

    from antdt.schemas.models import WorkerLifecycle

    fields = {name: (info.annotation, info) for name, info in WorkerLifecycle.model_fields.items()}
    fields.update(changes)
    return create_model("WorkerLifecycle", __base__=AvroRecord, **fields)


@pytest.mark.parametrize(
    "changes",
    [
        {"reason": (str, ...)},  # nullable and defaulted in the schema
        {"pid": (typing.Annotated[int, AvroType("long")], ...)},  # int in the schema
        {"exit_code": (typing.Annotated[int, AvroType("int")] | None, 0)},  # default differs
        {"host": (bytes, ...)},  # string in the schema
    ],
    ids=["nullability", "int-vs-long", "default", "type"],
)
def test_checker_detects_disagreement(changes):
    with pytest.raises(AssertionError):
        assert_record_matches(
            _mutated_lifecycle(**changes), SCHEMAS["WorkerLifecycle"], "WorkerLifecycle"
        )
