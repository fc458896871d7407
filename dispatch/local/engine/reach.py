"""Where a state dir's admission engine listens, and starting one when none answers.

One engine per configuration: its socket is ``state_dir/admitd-<digest>.sock``, the digest of the
settings it was given and of the protocol (``digest_of``), so two configurations sharing a state
dir each have theirs, and an engine of another hostrun speaking another protocol is another engine.
A run starts it under an flock on ``state_dir/admitd.lock`` (``admitclient.Link``): detached, its
settings on stdin, answering ``ready`` once it listens (``spawn``). On every run's path: standard
library only, ``_socket`` rather than ``socket``.
"""

from __future__ import annotations

import _socket
import os
import sys
import time

import dispatch
from dispatch.core.errors import EngineError

MYPY = False
if MYPY:
    from dispatch.core.settings import Settings

START_TIMEOUT = 20.0  # seconds for a started engine to answer (a loaded machine, a cold cache)
PROTOCOL = 2  # 2: the record goes with the release; a run's hello goes with its first request


def socket_path(state_dir: str, digest: str) -> str:
    return os.path.join(state_dir, f"admitd-{digest}.sock")


def lock_path(state_dir: str) -> str:
    return os.path.join(state_dir, "admitd.lock")


def log_path(state_dir: str) -> str:
    """What the engine says (why it did not start, a ledger it recovered, a crash)."""
    return os.path.join(state_dir, "admitd.log")


def unix_address(path: str, sock: _socket.socket, how: str) -> None:
    """``sock.bind`` or ``sock.connect`` (``how``) at ``path``, which may be longer than AF_UNIX
    takes (108 bytes; a deep state dir): then through ``/proc/self/fd`` of its directory."""
    if len(os.fsencode(path)) < 100:
        getattr(sock, how)(path)
        return
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        getattr(sock, how)(f"/proc/self/fd/{fd}/{os.path.basename(path)}")
    finally:
        os.close(fd)


def digest_of(settings: Settings) -> tuple[str, bytes]:
    """(the engine's name for these settings and this protocol, the settings as the engine reads
    them). The protocol is in the name, so an engine of another hostrun speaking another protocol
    (an upgrade while it runs) is another engine, not a refusal."""
    import marshal

    from dispatch.core.fingerprint import short_hash  # not hashlib: a plain run loads none

    data = marshal.dumps(settings.to_normalized())
    return short_hash(data + PROTOCOL.to_bytes(2, "big"), 16), data


def try_connect(path: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        unix_address(path, sock, "connect")
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise EngineError(f"cannot reach the admission engine at {path}: {exc.strerror}; "
                          "nothing ran") from None
    return sock


def spawn(state_dir: str, digest: str, data: bytes) -> str:
    """Start the engine detached (fork, a session of its own, fork again, exec: init adopts it),
    its settings in a pipe on its stdin; what it said (``ready PID``, or why it did not start).
    No ``subprocess``: a plain run loads none."""
    import select
    import signal

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(dispatch.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = log_path(state_dir)
    try:
        log_before = os.stat(log).st_size  # what this start writes comes after: only that is said
    except OSError:
        log_before = 0
    argv = [sys.executable, "-m", "dispatch.local.engine.admitd", state_dir, digest]
    settings_read, settings_write = os.pipe()
    os.write(settings_write, data)  # a few KiB: the pipe holds them until the engine reads
    os.close(settings_write)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            if os.fork() == 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, set())
                err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
                os.dup2(settings_read, 0)
                os.dup2(write_end, 1)
                os.dup2(err, 2)
                os.closerange(3, 65536)
                os.chdir("/")
                os.execve(sys.executable, argv, env)
            code = 0
        finally:
            os._exit(code)
    os.close(settings_read)
    os.close(write_end)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + START_TIMEOUT
    said = b""
    ended = False  # it closed its end (died) before it said ready, rather than said nothing in time
    try:
        while b"\n" not in said and time.monotonic() < deadline:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(read_end, 256)
            if not chunk:
                ended = True
                break
            said += chunk
    finally:
        os.close(read_end)
    if said.startswith(b"ready"):
        return said.decode(errors="replace").strip()
    try:
        with open(log, "rb") as fh:
            fh.seek(log_before)
            tail = fh.read()[-2000:].decode(errors="replace").strip().splitlines()
    except OSError:
        tail = []
    quiet = "it ended before it listened" if ended else f"no answer within {START_TIMEOUT:g} s"
    return (tail[-1] if tail else quiet) + f" (its log: {log})"
