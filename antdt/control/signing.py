"""HMAC-SHA256 signatures on mitigation commands.

Agents take orders only from their own controller: with a signing key
configured (``ANTDT_SIGNING_KEY``, shared by the controller and the agents),
every command carries an HMAC-SHA256 over its own Avro encoding with the
signature field null. The encoding is canonical (Avro binary of the current
schema), so anyone holding the key can verify a command with any Avro
library.
"""

from __future__ import annotations

import hashlib
import hmac

from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import MitigationCommand

_CODEC = SingleObjectCodec()


def signing_bytes(command: MitigationCommand) -> bytes:
    """The bytes a signature covers: the command encoded with ``signature`` null."""
    return _CODEC.encode(command.model_copy(update={"signature": None}))


def sign(command: MitigationCommand, key: bytes) -> MitigationCommand:
    """A copy of ``command`` carrying its signature."""
    digest = hmac.new(key, signing_bytes(command), hashlib.sha256).digest()
    return command.model_copy(update={"signature": digest})


def verify(command: MitigationCommand, key: bytes) -> bool:
    """True if the command carries a valid signature for ``key``."""
    if command.signature is None:
        return False
    expected = hmac.new(key, signing_bytes(command), hashlib.sha256).digest()
    return hmac.compare_digest(expected, command.signature)
