"""The wire format between ``hostrun --peer`` and the agent running the job on the peer.

Each frame is one type byte, a 4-byte big-endian length and the payload. The controller starts with
the run's spec, one ``J`` frame (JSON, the job's argv inside it), which the agent reads before anything
else: no argument rides on ssh's command line (one word of it is limited to 128 KiB), so the only
limit on the job's arguments is the peer's own ``ARG_MAX``.

The kinds, which side sends each and what its payload is: ``Frame`` below, the one table both
sides use. The sequence of a session: docs/design.md, "The wire protocol" and "A peer run".

Framing the job's output (rather than passing ssh's stdout/stderr through) keeps stdout and stderr
separate and binary-safe, and lets the result travel last on the same stream, unforgeable by the job.
"""

from __future__ import annotations

import os
import struct
import threading

from dispatch.core.fdio import write_all

HEADER = struct.Struct(">cI")
HEARTBEAT = 2.0
SILENCE_LIMIT = 15.0  # no frame for this long: the connection is gone
MAX_PAYLOAD = 1 << 20
MAX_SPEC = 256 << 20  # far above any ARG_MAX (6 MiB at most on Linux): only a guard against garbage
SYNC_MARK = "HOSTRUN_SYNC"  # NAME=token in the environment of the peer's rsync of one run's sync


class Frame:
    """The frame kinds, one byte each: the one table both sides use (a plain class, not an
    ``enum``: the members are the bytes that go on the wire, compared with ``==``)."""

    SPEC = b"J"  # controller -> agent, first: the run's spec (``dispatch.agent.wire.RunSpec``, JSON)
    PROBE = b"P"  # agent: probe results and work directory (JSON), when the spec asks to prepare
    OUT = b"O"  # agent: job stdout
    ERR = b"E"  # agent: job stderr
    MSG = b"M"  # agent: a hostrun message line
    ALERT = b"A"  # agent: the job has waited long there (JSON: ``alertlog.wait_figures``)
    RESULT = b"R"  # agent, last: the result (JSON)
    GO = b"G"  # controller: the sync is done, start the job (JSON after a sync: treestate)
    ABORT = b"X"  # controller: abort before the job started (nothing runs)
    SIGNAL = b"S"  # controller: forward a signal (payload: its number)
    DATA = b"D"  # controller: stdin data
    EOF = b"Z"  # controller: stdin closed
    BEAT = b"H"  # both ways: heartbeat, every ``HEARTBEAT`` s


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
            write_all(self.fd, data)


def read_spec(fd: int) -> bytes:
    """The spec frame, read from ``fd`` byte by byte exactly (the control frames follow it)."""

    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = os.read(fd, min(size - len(data), 1 << 20))
            if not chunk:
                raise EOFError("the controller closed the session before sending the spec")
            data += chunk
        return data

    kind, length = HEADER.unpack(exactly(HEADER.size))
    if kind != Frame.SPEC or length > MAX_SPEC:
        raise ValueError(f"expected the spec frame, got {kind!r} of {length} bytes")
    return exactly(length)


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
