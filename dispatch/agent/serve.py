"""``agent serve``: the agent kept running on the peer, answering reports over a Unix socket.

A per-call agent costs a Python start on the peer for every report (~47 ms here); a daemon answers
in a few ms. The controller starts it on demand through its existing ControlMaster (one session, no
second login) and reaches it through a socket forwarded by that master (``dispatch.hosts.ssh.agentd``).

- One daemon per agent version: the socket and lock are named after the agent's directory
  (``agent-<version>-<hash>``), so a new controller version starts a new daemon and the old idles out.
- The lock (``~/.cache/hostrun/agent-<name>.lock``, 0600, held with ``flock``) holds the daemon's pid
  and socket path; a second ``serve`` finds it held and only says where the socket is.
- The socket is ``~/.cache/hostrun/agent-<name>.sock``, or, when that path is too long for a Unix
  socket, ``/tmp/hostrun-agent-<uid>-<hash of $HOME>/<name>.sock``; its directory must be ours alone
  (owner, no group/other write, no symlink) or nothing is served. The socket is created 0600.
- Every connection's SO_PEERCRED is checked: only this uid gets an answer.
- It exits after ``idle`` seconds without a request, when its socket file is gone or replaced, and on
  SIGTERM, removing its socket and lock.
- One request per connection: 4-byte big-endian length, then JSON; the answer is framed the same way.
  The peer's config is read for every request (as the per-call agent does), so edits take effect.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import sys
import threading
import time

from dispatch.agent.socketframes import frame, read_frame

MYPY = False
if MYPY:
    from typing import Any

SOCKET_PATH_MAX = 100  # sun_path is 108 bytes
MAX_REQUEST = 1 << 20
CONNECTION_TIMEOUT = 10.0
UNTRUSTED = 2


def paths(agent_dir: str) -> tuple[str, str]:
    """(socket, lock) for the agent unpacked at ``agent_dir`` (absolute)."""
    from dispatch.core.fingerprint import short_hash

    parent, name = os.path.split(agent_dir.rstrip("/"))
    lock = os.path.join(parent, name + ".lock")
    preferred = os.path.join(parent, name + ".sock")
    if len(preferred) <= SOCKET_PATH_MAX:
        return preferred, lock
    from dispatch.core.configpath import user_home

    home = user_home()
    short = os.path.join("/tmp", f"hostrun-agent-{os.geteuid()}-{short_hash(home.encode(), 8)}")
    return os.path.join(short, name.replace("agent-", "", 1) + ".sock"), lock


def private_dir_problem(directory: str, create: bool) -> str | None:
    """Why ``directory`` cannot hold our socket (another owner, writable by others, a symlink)."""
    if create:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(directory)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() \
            or mode & 0o022:
        return (f"refusing {directory}: owned by uid {st.st_uid}, mode {mode:04o}"
                f"{' (a symlink)' if stat.S_ISLNK(st.st_mode) else ''}, not a private directory of ours")
    return None


def answer(request: dict[str, Any], name: str) -> dict[str, Any]:
    """The report the per-call ``agent report`` would print, for one request."""
    from dispatch.agent.prepare import agent_report

    if request.get("agent") != name:
        return {"agent": name, "error": f"this daemon is agent {name}, not {request.get('agent')}"}
    if request.get("command") != "report":
        return {"agent": name, "error": f"unknown command {request.get('command')!r}"}
    data = agent_report(dict(request.get("fallback") or {}), request.get("label"),
                        bool(request.get("peaks")))
    return {"agent": name, "report": data}


class Daemon:
    def __init__(self, listener: socket.socket, sock_path: str, lock_fd: int, lock_path: str,
                 name: str, idle: float) -> None:
        self.listener, self.sock_path, self.name, self.idle = listener, sock_path, name, idle
        self.lock_fd, self.lock_path = lock_fd, lock_path
        self.inode = os.lstat(sock_path).st_ino
        self.last = time.monotonic()
        self.served = 0
        self.mutex = threading.Lock()

    def socket_is_ours(self) -> bool:
        try:
            return os.lstat(self.sock_path).st_ino == self.inode
        except OSError:
            return False

    def loop(self) -> None:
        while True:
            interval = max(0.1, min(5.0, self.idle / 4))
            self.listener.settimeout(interval)
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                if time.monotonic() - self.last >= self.idle or not self.socket_is_ours():
                    return
                continue
            self.last = time.monotonic()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))[1]
            if uid != os.geteuid():
                return  # another user: closed without a word
            conn.settimeout(CONNECTION_TIMEOUT)
            try:
                request = json.loads(read_frame(conn, MAX_REQUEST))
                idle = request.get("idle")
                if isinstance(idle, (int, float)) and idle > 0:
                    self.idle = float(idle)  # the latest controller's agent_idle
                try:
                    reply = answer(request, self.name)
                except Exception as exc:  # reported; the controller falls back to the per-call agent
                    reply = {"agent": self.name, "error": f"{type(exc).__name__}: {exc}"}
                with self.mutex:
                    self.served += 1
                    reply.update(pid=os.getpid(), served=self.served)
                conn.sendall(frame(reply))
            except (OSError, EOFError, ValueError):
                return

    def cleanup(self) -> None:
        self.listener.close()
        if self.socket_is_ours():
            os.unlink(self.sock_path)
        try:
            if os.lstat(self.lock_path).st_ino == os.fstat(self.lock_fd).st_ino:
                os.unlink(self.lock_path)
        except OSError:
            pass
        os.close(self.lock_fd)


def serve(agent_dir: str, idle: float) -> int:
    """Start the daemon (detached) unless one holds the lock; print ``{"socket": PATH}`` either way."""
    import fcntl

    agent_dir = os.path.abspath(agent_dir)
    name = os.path.basename(agent_dir.rstrip("/")).replace("agent-", "", 1)  # bundle.name()
    os.umask(0o077)
    sock_path, lock_path = paths(agent_dir)
    for directory, create in ((os.path.dirname(lock_path), False), (os.path.dirname(sock_path), True)):
        problem = private_dir_problem(directory, create)
        if problem is not None:
            print(f"agent: {problem}; remove it", file=sys.stderr)
            return UNTRUSTED
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        print(json.dumps({"socket": sock_path, "started": False}))
        return 0
    st = os.fstat(lock_fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        print(f"agent: refusing {lock_path}: not a private file of ours", file=sys.stderr)
        return UNTRUSTED
    if os.path.lexists(sock_path):  # left by a daemon that was killed: the lock says none runs
        os.unlink(sock_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    st = os.lstat(sock_path)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        print(f"agent: refusing {sock_path}: not created private", file=sys.stderr)
        return UNTRUSTED
    listener.listen(64)
    print(json.dumps({"socket": sock_path, "started": True}), flush=True)
    if os.fork():
        os.wait()
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    _detach(Daemon(listener, sock_path, lock_fd, lock_path, name, idle))
    return 0  # not reached


def _detach(daemon: Daemon) -> None:
    """In the grandchild: stdio closed (so the ssh session ends), pid recorded, then serve."""
    import signal

    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.chdir("/")
    os.ftruncate(daemon.lock_fd, 0)
    os.pwrite(daemon.lock_fd, f"{os.getpid()}\n{daemon.sock_path}\n".encode(), 0)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        daemon.loop()
    finally:
        daemon.cleanup()
        os._exit(0)
