"""Messages between parameter-server clients and servers: a small JSON header and raw tensor bytes.

One frame is ``!IQ`` (header length, payload length), the header (orjson),
then the payload: the float32 values of a flat tensor, sent from the
tensor's own memory and received straight into a buffer, so a push or pull
costs one copy each way. Every blocking socket call has a timeout; a peer
that goes quiet or away raises :class:`WireError`.
"""

from __future__ import annotations

import socket
import struct

import orjson
import torch

from antdt.errors import AntdtError

FRAME = struct.Struct("!IQ")
MAX_HEADER = 1 << 20


class WireError(AntdtError):
    """The connection broke, timed out, or carried something that is not a frame."""


def send(sock: socket.socket, header: dict, payload: torch.Tensor | None = None) -> None:
    body = orjson.dumps(header)
    data = memoryview(payload.contiguous().numpy()).cast("B") if payload is not None else b""
    try:
        sock.sendall(FRAME.pack(len(body), len(data)) + body)
        if len(data):
            sock.sendall(data)
    except OSError as exc:
        raise WireError(f"send failed: {exc}") from None


def receive(sock: socket.socket) -> tuple[dict, torch.Tensor | None]:
    """The next frame: its header and, if any, its payload as a flat float32 tensor."""
    header_len, payload_len = FRAME.unpack(_exactly(sock, FRAME.size))
    if header_len > MAX_HEADER or payload_len % 4:
        raise WireError(f"not a frame (header {header_len} bytes, payload {payload_len} bytes)")
    header = orjson.loads(_exactly(sock, header_len))
    if not payload_len:
        return header, None
    buffer = bytearray(payload_len)
    _into(sock, memoryview(buffer))
    return header, torch.frombuffer(buffer, dtype=torch.float32)


def _exactly(sock: socket.socket, count: int) -> bytes:
    buffer = bytearray(count)
    _into(sock, memoryview(buffer))
    return bytes(buffer)


def _into(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        try:
            got = sock.recv_into(view)
        except OSError as exc:  # includes socket.timeout
            raise WireError(f"receive failed: {exc}") from None
        if not got:
            raise WireError("the peer closed the connection")
        view = view[got:]


def connect(address: str, timeout_s: float) -> socket.socket:
    """A connection to ``host:port`` with ``timeout_s`` on every call (Nagle off: frames are small
    and many)."""
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host or "localhost", int(port)), timeout=timeout_s)
    except (OSError, ValueError) as exc:
        raise WireError(f"cannot connect to {address}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
