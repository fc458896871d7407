"""A ``--gpu-memory`` job's output: forwarded live to hostrun's own stdout and stderr and scanned
for GPU out-of-memory messages (``OUTPUT_PATTERNS``).

cgroups do not cap VRAM, so a shortage shows only as a message; this is where the job's own output is
read for one. Kept apart from ``dispatch.local.gpus.gpu`` (the devices and the choice of one), since it is
a byte pump with back-pressure, not a GPU fact. Standard library only; imported with ``gpu`` alone.
"""

from __future__ import annotations

import os
import select
import time

from dispatch.local.gpus.kernlog import CHUNK, PatternScanner

# PyTorch, the CUDA driver API, JAX/XLA/TensorFlow, the CUDA runtime API, CuPy (seen on a real H200:
# CuPy's pool says only "OutOfMemoryError: Out of memory allocating N bytes").
OUTPUT_PATTERNS = (b"CUDA out of memory", b"CUDA_ERROR_OUT_OF_MEMORY", b"RESOURCE_EXHAUSTED",
                   b"cudaErrorMemoryAllocation", b"OutOfMemoryError: Out of memory allocating")
PIPE_BUF = 4096  # a write this small to a pipe that polls writable never blocks


class _Stream:
    def __init__(self, name: str, read_fd: int, target: int) -> None:
        self.name = name
        self.read_fd = read_fd
        self.target = target  # -1: hostrun's own stdout/stderr is closed; the output is discarded
        self.scanner = PatternScanner(OUTPUT_PATTERNS)
        self.pending = b""  # the chunk read from the job that is being written to the target
        self.sent = 0  # how much of it is written
        self.open = True


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _writable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(0))


class OutputTee:
    """The job's stdout and stderr as two pipes: forwarded live to hostrun's own, byte for byte,
    and scanned for GPU out-of-memory messages.

    Event-driven, so that a slow reader of hostrun's output never blocks hostrun itself (signals and
    ``--max-runtime`` keep working): a chunk read from the job is written on in pieces of at most
    ``PIPE_BUF`` bytes, each only once the target polls writable; until it is all written, that
    stream's pipe is not read, so the job feels the reader's pace as it would writing directly.
    Memory use is bounded by one chunk per stream plus the scanners' short tails. If hostrun's own
    stdout/stderr goes away (EPIPE), that pipe is closed, so the job gets EPIPE/SIGPIPE as it would
    have.
    """

    def __init__(self) -> None:
        targets = [fd if _is_open(fd) else -1 for fd in (1, 2)]  # before a pipe could take 1 or 2
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.child_fds: tuple[int, int] | None = (out_w, err_w)
        self._streams = {out_r: _Stream("stdout", out_r, targets[0]),
                         err_r: _Stream("stderr", err_r, targets[1])}
        self._by_target = {s.target: s for s in self._streams.values() if s.target >= 0}

    def parent_side(self) -> None:
        """After the fork: close the write ends here, so EOF comes once the job's side closes."""
        if self.child_fds is not None:
            for fd in self.child_fds:
                os.close(fd)
            self.child_fds = None

    def register(self, poller: select.poll) -> None:
        for s in self._streams.values():
            if s.open:
                poller.register(s.read_fd, select.POLLIN)

    def handle(self, poller: select.poll, fd: int, events: int) -> None:
        """Act on one poll event for a descriptor this tee registered."""
        s = self._streams.get(fd)
        if s is not None:
            if s.open and not s.pending:
                self._read(poller, s)
            return
        s = self._by_target.get(fd)
        if s is not None:
            self._flush(poller, s)

    def _read(self, poller: select.poll, s: _Stream) -> bool:
        """Read one chunk; False once the stream has ended."""
        try:
            data = os.read(s.read_fd, CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self._close(poller, s)
            return False
        s.scanner.feed(data)
        if s.target < 0:
            return True
        s.pending, s.sent = data, 0
        _unregister(poller, s.read_fd)  # paused until this chunk is written on
        self._flush(poller, s)
        return True

    def _flush(self, poller: select.poll, s: _Stream) -> None:
        while s.sent < len(s.pending):
            if not _writable(s.target):
                poller.register(s.target, select.POLLOUT)
                return
            try:
                s.sent += os.write(s.target, s.pending[s.sent:s.sent + PIPE_BUF])
            except BlockingIOError:
                poller.register(s.target, select.POLLOUT)
                return
            except OSError:  # EPIPE & co: the reader of hostrun's output is gone
                s.pending, s.sent = b"", 0
                _unregister(poller, s.target)
                self._close(poller, s)
                return
        s.pending, s.sent = b"", 0
        _unregister(poller, s.target)
        if s.open:
            poller.register(s.read_fd, select.POLLIN)

    def _close(self, poller: select.poll, s: _Stream) -> None:
        if s.open:
            _unregister(poller, s.read_fd)
            os.close(s.read_fd)
            s.open = False

    @property
    def busy(self) -> bool:
        return any(s.open or s.pending for s in self._streams.values())

    def drain(self, quiet: float = 0.5, budget: float = 5.0) -> None:
        """After the job: forward what is left, until both pipes reach EOF.

        Waiting for hostrun's own reader has no time limit (the job's output is never dropped for a
        slow reader). Waiting for the job's side does: a writer that outlived the job (possible only
        without a cgroup) that stays silent for ``quiet`` seconds, or keeps writing for ``budget``
        seconds of waiting in all, is given up on.
        """
        poller = select.poll()
        for s in self._streams.values():
            if s.pending:
                self._flush(poller, s)
            elif s.open:
                poller.register(s.read_fd, select.POLLIN)
        waited = 0.0
        while self.busy:
            reading = not any(s.pending for s in self._streams.values())
            began = time.monotonic()
            events = poller.poll(quiet * 1000 if reading else None)
            if reading:
                waited += time.monotonic() - began
                if not events or waited >= budget:
                    break
            for fd, ev in events:
                self.handle(poller, fd, ev)
        self.close()

    def close(self) -> None:
        for fd in self.child_fds or ():
            os.close(fd)
        self.child_fds = None
        for s in self._streams.values():
            if s.open:
                os.close(s.read_fd)
                s.open = False
            s.pending, s.sent = b"", 0

    @property
    def evidence(self) -> str | None:
        for s in self._streams.values():
            if s.scanner.found is not None:
                return f"the job's {s.name} shows {s.scanner.found.decode()!r}"
        return None


def _unregister(poller: select.poll, fd: int) -> None:
    try:
        poller.unregister(fd)
    except KeyError:
        pass
