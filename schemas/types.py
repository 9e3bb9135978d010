"""Field types shared by the message models, each tagged with its Avro type.

Python has one ``int``; Avro has ``int`` and ``long``. The aliases here carry
that choice as metadata (:class:`AvroType`) so the contract test can check
every model field against its ``.avsc`` declaration, and they validate the
32-bit range where Avro would otherwise fail at encode time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, Field

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class AvroType:
    """Marks a model field with the Avro primitive (or logical) type it maps to."""

    name: str


def _as_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


Int32 = Annotated[int, AvroType("int"), Field(ge=INT32_MIN, le=INT32_MAX)]
Count32 = Annotated[int, AvroType("int"), Field(ge=0, le=INT32_MAX)]
Positive32 = Annotated[int, AvroType("int"), Field(ge=1, le=INT32_MAX)]
Long = Annotated[int, AvroType("long"), Field(ge=INT64_MIN, le=INT64_MAX)]
Count64 = Annotated[int, AvroType("long"), Field(ge=0, le=INT64_MAX)]
Positive64 = Annotated[int, AvroType("long"), Field(ge=1, le=INT64_MAX)]
Double = Annotated[float, AvroType("double"), Field(allow_inf_nan=False)]
Seconds = Annotated[float, AvroType("double"), Field(ge=0, allow_inf_nan=False)]
Percent = Annotated[float, AvroType("double"), Field(ge=0, allow_inf_nan=False)]
Timestamp = Annotated[datetime, AvroType("timestamp-millis"), AfterValidator(_as_utc)]
Name = Annotated[str, AvroType("string"), Field(min_length=1, max_length=256)]


def utc_now() -> datetime:
    """Current time in UTC, truncated to what timestamp-millis keeps."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)
