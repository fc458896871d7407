"""The wire format between ``hostrun --peer`` and the agent running the job on the peer.

Each frame is one type byte, a 4-byte big-endian length and the payload. Agent → controller:
``O`` job stdout, ``E`` job stderr, ``M`` a hostrun message line (admission status and the like),
``R`` the result (JSON), last. Controller → agent: ``H`` heartbeat (every ``HEARTBEAT`` s), ``S``
forward a signal (payload: its number), ``D`` stdin data, ``Z`` stdin closed.

Framing the job's output (rather than passing ssh's stdout/stderr through) keeps stdout and stderr
separate and binary-safe, and lets the result travel last on the same stream, unforgeable by the job.
"""

from __future__ import annotations

import os
import struct
import threading

HEADER = struct.Struct(">cI")
HEARTBEAT = 2.0
SILENCE_LIMIT = 15.0  # no frame for this long: the connection is gone
MAX_PAYLOAD = 1 << 20


def encode(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


class FrameWriter:
    """Writes whole frames to a file descriptor; safe to share between threads."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        data = encode(kind, payload)
        with self._lock:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]


class FrameReader:
    """Incremental decoder: feed bytes, get complete (kind, payload) frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buffer)
            if length > MAX_PAYLOAD:
                raise ValueError(f"frame of {length} bytes: not a hostrun agent stream")
            if len(self._buffer) < HEADER.size + length:
                break
            frames.append((kind, bytes(self._buffer[HEADER.size:HEADER.size + length])))
            del self._buffer[:HEADER.size + length]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buffer)
