"""Loads the ``.avsc`` contracts and indexes every known writer schema by fingerprint.

A reader must decode data written with any schema version it has ever
shipped, so the store holds the current schemas (``avro/``) and the released
copies (``released/``); each is indexed by its CRC-64-AVRO fingerprint, the
64-bit Rabin fingerprint of its Parsing Canonical Form (Avro specification).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from antdt.errors import SchemaError, UnknownSchemaError

CURRENT_DIR = "avro"
RELEASED_DIR = "released"

_EMPTY64 = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> bytes:
    """CRC-64-AVRO fingerprint of ``data``, as the 8 little-endian bytes the spec frames."""
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


@dataclass(frozen=True)
class SchemaVersion:
    """One writer schema: its full name, raw JSON, parsed form and fingerprint."""

    name: str
    raw: dict[str, Any]
    parsed: Any
    canonical: str
    fingerprint: bytes
    current: bool


class SchemaStore:
    """Every schema this build can read, by record name and by fingerprint."""

    def __init__(self, versions: list[SchemaVersion]):
        self._by_fingerprint = {v.fingerprint: v for v in versions}
        self._current = {v.name: v for v in versions if v.current}

    def current(self, name: str) -> SchemaVersion:
        """The schema this build writes for record ``name``."""
        try:
            return self._current[name]
        except KeyError:
            raise SchemaError(f"no schema for record {name!r}") from None

    def by_fingerprint(self, fingerprint: bytes) -> SchemaVersion:
        """The writer schema named by a single-object fingerprint."""
        try:
            return self._by_fingerprint[fingerprint]
        except KeyError:
            raise UnknownSchemaError(
                f"unknown writer schema fingerprint {fingerprint.hex()}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._current)

    def versions(self) -> list[SchemaVersion]:
        return list(self._by_fingerprint.values())


def load_version(raw: dict[str, Any], current: bool) -> SchemaVersion:
    """Parse one schema document into a :class:`SchemaVersion`."""
    try:
        parsed = fastavro.parse_schema(raw)
    except Exception as exc:  # fastavro raises several unrelated types
        raise SchemaError(f"invalid Avro schema {raw.get('name')!r}: {exc}") from exc
    canonical = to_parsing_canonical_form(raw)
    name = f"{raw.get('namespace')}.{raw['name']}" if raw.get("namespace") else raw["name"]
    return SchemaVersion(name, raw, parsed, canonical, crc64_avro(canonical.encode()), current)


def read_schema_files(folder: str) -> dict[str, dict[str, Any]]:
    """Every ``.avsc`` in a folder of the package, by file stem."""
    root = resources.files("antdt.schemas").joinpath(folder)
    documents = {}
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".avsc"):
            documents[entry.name.removesuffix(".avsc")] = json.loads(entry.read_text())
    return documents


@cache
def default_store() -> SchemaStore:
    """The store of the installed package's schemas, loaded once."""
    versions = [load_version(raw, current=True) for raw in read_schema_files(CURRENT_DIR).values()]
    seen = {v.fingerprint for v in versions}
    for raw in read_schema_files(RELEASED_DIR).values():
        released = load_version(raw, current=False)
        if released.fingerprint not in seen:
            versions.append(released)
    return SchemaStore(versions)
