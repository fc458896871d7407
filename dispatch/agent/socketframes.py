"""The report daemon's framing, one request and one answer per connection (``dispatch.agent.serve``
on the peer, ``dispatch.hosts.ssh.agentd`` here): a 4-byte big-endian length, then JSON."""

from __future__ import annotations

import json
import socket
import struct

MYPY = False
if MYPY:
    from typing import Any

LENGTH = struct.Struct(">I")


def frame(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload).encode()
    return LENGTH.pack(len(body)) + body


def read_frame(conn: socket.socket, limit: int) -> bytes:
    """One frame's body; EOFError when the connection closes first, ValueError over ``limit``."""
    (size,) = LENGTH.unpack(_exactly(conn, LENGTH.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes")
    return _exactly(conn, size)


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the connection closed before the whole frame")
        data += chunk
    return data
