"""The kernel log, watched for ``NV_ERR_NO_MEMORY`` while a job runs (one cause of exit 245).

Every job on a host with NVIDIA GPUs carries a :class:`KernelWatch`, so this module is on the path of
a plain ``hostrun -- CMD`` there and is kept small: standard library only, nothing of ``nvidia-smi``
or the output tee (``dispatch.local.gpus.gputee``, loaded for ``--gpu-memory`` jobs alone). On a host
without GPUs
nothing here is loaded.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence

MYPY = False
if MYPY:
    import select
    from typing import Protocol

    class OutputTee(Protocol):
        """What the run loop asks of a ``--gpu-memory`` job's output tee (``dispatch.local.gpus.gputee``)."""

        @property
        def evidence(self) -> str | None: ...
        def parent_side(self) -> None: ...
        def drain(self, quiet: float = ..., budget: float = ...) -> None: ...
        def close(self) -> None: ...
        def register(self, poller: select.poll) -> None: ...
        def handle(self, poller: select.poll, fd: int, events: int) -> None: ...

KERNEL_PATTERNS = (b"NV_ERR_NO_MEMORY",)
KERNEL_LOG_ENV = "HOSTRUN_KERNEL_LOG"  # test hook: a plain file read instead of /dev/kmsg
KMSG = "/dev/kmsg"
CHUNK = 1 << 16


class PatternScanner:
    """Finds the first of ``patterns`` in a byte stream fed in chunks, even across chunk boundaries.

    Only the last ``len(longest pattern) - 1`` bytes are kept between chunks.
    """

    def __init__(self, patterns: Sequence[bytes]) -> None:
        self.patterns = tuple(patterns)
        self.keep = max(len(p) for p in self.patterns) - 1
        self.tail = b""
        self.found: bytes | None = None

    def feed(self, data: bytes) -> bytes | None:
        if self.found is None and data:
            window = self.tail + data
            for pattern in self.patterns:
                if pattern in window:
                    self.found, self.tail = pattern, b""
                    break
            else:
                self.tail = window[-self.keep:] if self.keep else b""
        return self.found


class KernelLog:
    """Kernel messages logged while the job runs, scanned for ``NV_ERR_NO_MEMORY``.

    ``/dev/kmsg`` is opened non-blocking and positioned at its end when the job starts (each read
    returns one record; EAGAIN at the end; EPIPE when records were overwritten before being read), and
    read at every sampling tick and once at the end. With ``HOSTRUN_KERNEL_LOG=PATH`` (a test hook) the
    plain file PATH is read instead, and only what is appended after the job started counts. Where the
    log cannot be opened (no CAP_SYSLOG, a container), ``error`` says why and only a ``--gpu-memory``
    job's output counts.
    The kernel log is host-wide: a driver failure of another process during the run is seen too, which
    is why it decides 245 only for a job that failed.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.path = env.get(KERNEL_LOG_ENV) or KMSG
        self.is_kmsg = self.path == KMSG
        self.scanner = PatternScanner(KERNEL_PATTERNS)
        self.error: str | None = None
        self.fd = -1
        self.offset = 0
        try:
            if self.is_kmsg:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                os.lseek(self.fd, 0, os.SEEK_END)
            else:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                self.offset = os.lseek(self.fd, 0, os.SEEK_END)
        except OSError as exc:
            self.error = f"cannot read the kernel log {self.path}: {exc.strerror}"
            self.close()

    def scan(self) -> None:
        if self.fd < 0 or self.scanner.found is not None:
            return
        if self.is_kmsg:
            self._scan_kmsg()
        else:
            self._scan_file()

    def _scan_kmsg(self) -> None:
        for _ in range(10000):  # one record per read; bounded per tick
            try:
                record = os.read(self.fd, 8192)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # older records were overwritten; go on with the next one
                self.error = f"reading {self.path}: {exc.strerror}"
                self.close()
                return
            if not record:
                return
            if self.scanner.feed(record + b"\n"):
                return

    def _scan_file(self) -> None:
        try:
            if os.fstat(self.fd).st_size < self.offset:
                self.offset = 0  # truncated or replaced: start again from its beginning
            while True:
                data = os.pread(self.fd, CHUNK, self.offset)
                if not data:
                    return
                self.offset += len(data)
                if self.scanner.feed(data):
                    return
        except OSError as exc:
            self.error = f"reading {self.path}: {exc.strerror}"
            self.close()

    @property
    def evidence(self) -> str | None:
        if self.scanner.found is None:
            return None
        return f"the kernel log ({self.path}) shows {self.scanner.found.decode()!r} during the run"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class KernelWatch:
    """What every job on a host with NVIDIA GPUs carries: the kernel log from its start to its end.

    A job need not declare ``--gpu-memory`` to run out of VRAM, so each one is watched for
    ``NV_ERR_NO_MEMORY``; its output is left alone (only a ``--gpu-memory`` job is teed: :class:`GpuRun`).
    Where the log cannot be read, ``finish`` finds nothing and says nothing (``hostrun doctor`` does).
    """

    def __init__(self) -> None:
        self.tee: OutputTee | None = None
        self.kernel_log: KernelLog | None = None

    def job_starts(self) -> None:
        """Just before the job execs: only what the kernel logs from here counts."""
        self.kernel_log = KernelLog()

    def tick(self) -> None:
        if self.kernel_log is not None:
            self.kernel_log.scan()

    def finish(self) -> str | None:
        """After the job: the rest of the log, and what shows a GPU OOM, if anything."""
        if self.kernel_log is None:
            return None
        self.kernel_log.scan()
        return self.kernel_log.evidence

    def close(self) -> None:
        if self.kernel_log is not None:
            self.kernel_log.close()
