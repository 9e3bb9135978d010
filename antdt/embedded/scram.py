"""The server side of SASL/SCRAM (RFC 5802, RFC 7677), as Apache Kafka does it.

The embedded broker cannot check SCRAM credentials itself (see
:mod:`antdt.embedded.sasl_front`), so antdt's front for it does. Credentials are kept
the way Kafka keeps them: salt, iterations, stored key and server key, never
the password. An unknown user gets a deterministic fake salt and fails at the
proof with the same answer as a wrong password, so a client cannot tell which
of the two it got wrong (Kafka does the same).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

#: Kafka's SCRAM mechanisms and their hash functions.
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Kafka's minimum (and kafka-configs' default) iteration count.
DEFAULT_ITERATIONS = 4096


class ScramFailure(Exception):
    """The client's messages are malformed or its proof is wrong; the text is for the broker's
    log."""


@dataclass(frozen=True)
class ScramCredential:
    """What the server keeps for one user and mechanism (RFC 5802 section 3)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def make_credential(
    mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    """Derive the stored credential for ``password`` (the password itself is not kept)."""
    digest = MECHANISMS[mechanism]
    salt = salt if salt is not None else secrets.token_bytes(32)
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
    client_key = _hmac(digest, salted, b"Client Key")
    return ScramCredential(
        salt,
        iterations,
        hashlib.new(digest, client_key).digest(),
        _hmac(digest, salted, b"Server Key"),
    )


def _hmac(digest: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, digest).digest()


def _attributes(message: str) -> dict[str, str]:
    """``a=1,b=2`` -> ``{"a": "1", "b": "2"}`` (values may contain ``=``)."""
    try:
        return dict(part.split("=", 1) for part in message.split(","))
    except ValueError:
        raise ScramFailure(f"malformed SCRAM message {message[:80]!r}") from None


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ScramFailure("client proof is not base64") from None


def _username(escaped: str) -> str:
    return escaped.replace("=2C", ",").replace("=3D", "=")


class ScramServerExchange:
    """One SCRAM exchange: :meth:`first` answers client-first, :meth:`final` checks the proof.

    ``lookup(username)`` returns the user's credential for this mechanism, or None.
    """

    def __init__(self, mechanism: str, lookup, fake_salt_key: bytes):
        self.mechanism = mechanism
        self.username: str | None = None
        self._digest = MECHANISMS[mechanism]
        self._lookup = lookup
        self._fake_salt_key = fake_salt_key
        self._credential: ScramCredential | None = None
        self._known = False
        self._client_first_bare = self._server_first = self._gs2_header = self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        """Answer the client-first message with the salt, iterations and a combined nonce."""
        text = client_first.decode("utf-8", "replace")
        header, sep, bare = text.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not sep or not sep2 or header not in ("n", "y"):
            raise ScramFailure("malformed client-first message (channel binding is not supported)")
        attributes = _attributes(bare)
        if "n" not in attributes or "r" not in attributes:
            raise ScramFailure("client-first message lacks the user name or nonce")
        self.username = _username(attributes["n"])
        self._gs2_header, self._client_first_bare = f"{header},{authzid},", bare
        self._credential = self._lookup(self.username)
        self._known = self._credential is not None
        if not self._known:
            self._credential = self._fake_credential(self.username)
        self._nonce = attributes["r"] + secrets.token_urlsafe(18)
        salt = base64.b64encode(self._credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self._credential.iterations}"
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """Check the client's proof; return the server-final message, or raise ScramFailure."""
        text = client_final.decode("utf-8", "replace")
        without_proof, sep, proof = text.rpartition(",p=")
        attributes = _attributes(without_proof) if sep else {}
        if attributes.get("r") != self._nonce:
            raise ScramFailure("client-final message has a wrong nonce")
        if attributes.get("c") != base64.b64encode(self._gs2_header.encode()).decode():
            raise ScramFailure("client-final message has a wrong channel binding")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        if not self._known or not self._proof_matches(_b64decode(proof), auth_message):
            raise ScramFailure(f"invalid credentials for user {self.username!r}")
        signature = _hmac(self._digest, self._credential.server_key, auth_message)
        return b"v=" + base64.b64encode(signature)

    def _proof_matches(self, proof: bytes, auth_message: bytes) -> bool:
        client_signature = _hmac(self._digest, self._credential.stored_key, auth_message)
        if len(proof) != len(client_signature):
            return False
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        return hmac.compare_digest(
            hashlib.new(self._digest, client_key).digest(), self._credential.stored_key
        )

    def _fake_credential(self, username: str) -> ScramCredential:
        """A stable salt for an unknown user, so probing twice does not reveal that it is
        unknown."""
        salt = _hmac("sha256", self._fake_salt_key, username.encode())
        return ScramCredential(salt, DEFAULT_ITERATIONS, b"", b"")
