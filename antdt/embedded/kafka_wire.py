"""Just enough of the Kafka wire protocol to authenticate a connection.

:mod:`antdt.embedded.sasl_front` answers ``SaslHandshake`` and ``SaslAuthenticate``
itself and passes everything else through as opaque frames, so only those
two requests are decoded here, in the non-flexible versions every Kafka
client speaks (``SaslHandshake`` v1, ``SaslAuthenticate`` v0 and v1).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36

NONE = 0
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
SASL_AUTHENTICATION_FAILED = 58

MAX_FRAME = 100 << 20


class WireError(Exception):
    """The peer closed the connection or sent something that is not a Kafka request."""


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed frame, without its size."""
    (size,) = struct.unpack(">i", _read_exactly(sock, 4))
    if not 0 < size <= MAX_FRAME:
        raise WireError(f"bad frame size {size}")
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, missing = [], count
    while missing:
        chunk = sock.recv(missing)
        if not chunk:
            raise WireError("connection closed")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def write_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">i", len(payload)) + payload)


@dataclass(frozen=True)
class Request:
    """A request's header (v1: key, version, correlation id, client id) and its undecoded body."""

    api_key: int
    api_version: int
    correlation_id: int
    body: bytes

    @classmethod
    def parse(cls, frame: bytes) -> Request:
        if len(frame) < 10:
            raise WireError("request shorter than its header")
        api_key, api_version, correlation_id, client_id_length = struct.unpack(">hhih", frame[:10])
        return cls(api_key, api_version, correlation_id, frame[10 + max(client_id_length, 0) :])


def string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def nullable_string(value: str | None) -> bytes:
    return struct.pack(">h", -1) if value is None else string(value)


def length_prefixed_bytes(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def parse_string(body: bytes) -> str:
    (length,) = struct.unpack(">h", body[:2])
    return body[2 : 2 + length].decode("utf-8", "replace")


def parse_bytes(body: bytes) -> bytes:
    (length,) = struct.unpack(">i", body[:4])
    return body[4 : 4 + length]


def handshake_response(request: Request, error_code: int, mechanisms: list[str]) -> bytes:
    """``SaslHandshake`` response: error code and the mechanisms enabled."""
    names = b"".join(string(name) for name in mechanisms)
    return struct.pack(">ihi", request.correlation_id, error_code, len(mechanisms)) + names


def authenticate_response(
    request: Request, error_code: int, message: str | None, auth_bytes: bytes
) -> bytes:
    """``SaslAuthenticate`` response; v1 adds the session lifetime (0: never re-authenticate)."""
    payload = (
        struct.pack(">ih", request.correlation_id, error_code)
        + nullable_string(message)
        + length_prefixed_bytes(auth_bytes)
    )
    return payload + (struct.pack(">q", 0) if request.api_version >= 1 else b"")
