"""HMAC-SHA256 signatures on the records that carry authority: commands and control changes.

A signed record carries an HMAC-SHA256 over its own Avro encoding with the
signature field null. The encoding is canonical (Avro binary of the current
schema), so anyone holding the key can verify a record with any Avro
library. Two keys, held by different parties (docs/architecture.md):

- commands: ``ANTDT_SIGNING_KEY``, shared by the controller and the agents,
  so agents take orders only from their own controller;
- control changes: ``ANTDT_CONTROL_KEY``, held by operators and the
  services but never by the agents, which run the users' code.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import TypeVar

from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import ControlConfig, MitigationCommand

_CODEC = SingleObjectCodec()

Signed = TypeVar("Signed", MitigationCommand, ControlConfig)


def signing_bytes(record: MitigationCommand | ControlConfig) -> bytes:
    """The bytes a signature covers: the record encoded with ``signature`` null."""
    return _CODEC.encode(record.model_copy(update={"signature": None}))


def sign(record: Signed, key: bytes) -> Signed:
    """A copy of ``record`` carrying its signature."""
    digest = hmac.new(key, signing_bytes(record), hashlib.sha256).digest()
    return record.model_copy(update={"signature": digest})


def verify(record: MitigationCommand | ControlConfig, key: bytes) -> bool:
    """True if the record carries a valid signature for ``key``."""
    if record.signature is None:
        return False
    expected = hmac.new(key, signing_bytes(record), hashlib.sha256).digest()
    return hmac.compare_digest(expected, record.signature)


def verify_any(record: MitigationCommand | ControlConfig, keys: Iterable[bytes]) -> bool:
    """True if the record is signed with one of ``keys`` (a key being rotated out, and its
    successor)."""
    return any(verify(record, key) for key in keys)
