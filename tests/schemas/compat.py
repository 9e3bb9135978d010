"""BACKWARD compatibility of each schema with its last released copy.

BACKWARD means a consumer on the new schema can read everything written with
the released one: new fields need defaults, no field may change to an
incompatible type, no enum symbol may disappear. The check uses the reference
Apache Avro implementation's reader/writer compatibility rules (``avro``, a
dev dependency), so it agrees with what other Avro tooling enforces.

Release procedure: when a version ships, copy ``avro/X.avsc`` over
``released/X.avsc``. Until then every change is checked against the copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from antdt.schemas.store import CURRENT_DIR, RELEASED_DIR, read_schema_files


@dataclass(frozen=True)
class CompatibilityReport:
    """Outcome of checking one schema against its released copy."""

    name: str
    compatible: bool
    problems: tuple[str, ...]


def check_backward(current: dict[str, Any], released: dict[str, Any]) -> CompatibilityReport:
    """Can a reader on ``current`` read data written with ``released``?"""
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
    from avro.schema import parse

    result = ReaderWriterCompatibilityChecker().get_compatibility(
        reader=parse(json.dumps(current)), writer=parse(json.dumps(released))
    )
    compatible = result.compatibility is SchemaCompatibilityType.compatible
    problems = tuple(
        f"{kind.name if hasattr(kind, 'name') else kind}: {message} at {location}"
        for kind, message, location in zip(
            result.incompatibilities, result.messages, result.locations
        )
    )
    return CompatibilityReport(current.get("name", "?"), compatible, problems)


def check_all() -> list[CompatibilityReport]:
    """Check every current schema that has a released copy."""
    current = read_schema_files(CURRENT_DIR)
    released = read_schema_files(RELEASED_DIR)
    return [
        check_backward(current[name], released[name])
        for name in sorted(current)
        if name in released
    ]
