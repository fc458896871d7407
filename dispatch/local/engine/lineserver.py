"""The resident servers' connection machinery: one thread, one ``selectors`` loop, JSON lines.

Both of hostrun's resident processes stand on it: the admission engine of a state dir
(``dispatch.local.engine.admitd``) and the root daemon of a shared slice
(``dispatch.local.shared.sharedd``). What
it guarantees, against a caller that wants more than its share or is merely broken:

- A caller is who the kernel says (``SO_PEERCRED``: ``Connection.uid``, ``.pid``), never what it writes.
- A request line is at most ``MAX_REQUEST`` bytes, JSON nested too deep is refused, and any failure
  of one request ends only its connection (``handle`` raising ``ValueError``/``TypeError``/``OSError``
  answers ``{"error": …}``; anything else ends that connection and the loop goes on).
- Sockets never block: answers a caller does not read queue up to ``MAX_OUTPUT`` bytes, past which
  its connection is dropped. At most ``BATCH`` requests of one caller are handled in a row.
- ``max_clients`` connections in all, ``max_per_uid`` per user; out of descriptors, it stops
  accepting for ``ACCEPT_PAUSE`` seconds instead of dying.

A server subclasses ``LineServer``: ``handle`` answers a request, ``dropped`` gives back what a
closed connection held, ``evaluate`` runs after the sockets on each turn while ``busy`` (at least
every ``tick`` seconds), ``idle`` after ``idle_after`` seconds with no connection. Standard library only.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import struct
import sys
import time

from dispatch.capping.shared import decode, encode

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.core.engineshape import Reply, Request

MAX_REQUEST = 64 << 10  # bytes in one request line (hostrun's are under 1 KiB)
MAX_OUTPUT = 256 << 10  # bytes of answers queued for a caller that does not read them
BATCH = 64  # one caller's requests handled in a row before the others get their turn
ACCEPT_PAUSE = 0.5  # seconds without accepting once out of descriptors (accept would fail at once)
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def raise_descriptor_limit(want: int) -> int:
    """Room for ``want`` descriptors (every connection a server may hold, and what a request
    needs), as far as the hard limit allows (a unit's LimitNOFILE may set it too): the limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return want if soft == resource.RLIM_INFINITY else soft


class Connection:
    """One caller, and the answers it has yet to read.

    ``send`` never blocks: what the socket does not take at once waits in ``out`` for the loop to
    write when the caller reads; a caller whose ``out`` would pass ``MAX_OUTPUT`` is ``end``ed.
    Either way the loop learns of it through ``dirty``."""

    def __init__(self, sock: socket.socket, uid: int, pid: int, seq: int, dirty: set[Any]) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.uid = uid
        self.pid = pid
        self.seq = seq
        self.buf = b""
        self.out = bytearray()
        self.gone = ""  # why the loop is to drop this connection ("" while it is not)
        self.events = selectors.EVENT_READ
        self._dirty = dirty

    encode = staticmethod(encode)  # how answers are written (a server may frame them otherwise)

    def send(self, message: Reply) -> None:
        if self.gone:
            return
        data = self.encode(message)
        if self.out:
            if len(self.out) + len(data) > MAX_OUTPUT:
                self.end(f"does not read its answers ({len(self.out)} bytes unread)")
                return
            self.out += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.end("")  # gone: nothing to say to it
            return
        if sent < len(data):
            self.out += data[sent:]
            self._dirty.add(self)  # the loop waits until it can write the rest

    def flush(self) -> None:
        """Write what the socket takes of ``out`` (the loop saw it writable)."""
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError:
            self.end("")
            return
        del self.out[:sent]
        if not self.out:
            self._dirty.add(self)

    def end(self, why: str) -> None:
        self.gone = why or "closed"
        self._dirty.add(self)


class LineServer:
    """The loop; see the module's docstring for what a subclass provides."""

    name = "hostrun"  # in log lines and refusals
    max_clients = 1024
    max_per_uid = 128
    tick = 1.0
    idle_after: float | None = None
    request_errors: tuple[type[Exception], ...] = (OSError, ValueError, TypeError)  # answered, not fatal
    frame = staticmethod(encode)  # how a refused connection is told why (as its ``Connection.encode``)

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.clients: dict[int, Any] = {}
        self.per_uid: dict[int, int] = {}
        self.dirty: set[Any] = set()
        self.pending: set[Any] = set()  # callers with whole request lines not yet handled
        self.seq = 0
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.accepting = True
        self._accept_again = 0.0
        self._quiet_since = time.monotonic()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # a signal's nudge

    # -- what a server provides -------------------------------------------------------------------

    def connection(self, sock: socket.socket, uid: int, pid: int, seq: int) -> Any:
        """The object for a new caller (a ``Connection``), or raise ValueError to refuse it."""
        return Connection(sock, uid, pid, seq, self.dirty)

    def handle(self, client: Any, message: Request) -> Reply | None:
        raise NotImplementedError

    def dropped(self, client: Any) -> None:
        """A connection closed: give back what it held."""

    def busy(self) -> bool:
        """Whether ``evaluate`` has work (then the loop wakes every ``tick``)."""
        return False

    def evaluate(self) -> None:
        """After the sockets, on every turn while ``busy``."""

    def idle(self) -> bool:
        """No connection for ``idle_after`` seconds: True ends the loop."""
        return False

    def refusal(self, exc: Exception) -> Reply:
        """The answer to a request that raised one of ``request_errors``."""
        return {"error": str(exc)[:500]}

    def log(self, text: str) -> None:
        try:
            print(f"{self.name}: {text}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    # -- the loop ---------------------------------------------------------------------------------

    def serve(self, handle_signals: bool = True) -> None:
        """Until SIGTERM/SIGINT (``handle_signals``, the main thread's), ``stop``, or ``idle``."""
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.selector.register(self._wake_read, selectors.EVENT_READ, self)
        if handle_signals:
            signal.signal(signal.SIGTERM, self._stop)
            signal.signal(signal.SIGINT, self._stop)
        self.started()
        while not self.stopping:
            self._turn()
        for client in list(self.clients.values()):
            self._drop(client, evaluate=False)
        self.selector.close()
        self.listener.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def started(self) -> None:
        """Before the first turn."""

    def _turn(self) -> None:
        """One wake-up: what the sockets have, the requests pending, then ``evaluate``."""
        busy = self.busy()
        timeout = 0.0 if self.pending else self.tick if busy else None
        if timeout is None and self.idle_after is not None:
            timeout = max(0.05, self._quiet_since + self.idle_after - time.monotonic()) \
                if not self.clients else None
        if not self.accepting:
            left = max(0.0, self._accept_again - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        for key, events in self.selector.select(timeout):
            client = key.data
            if client is self:  # woken to notice ``stopping``
                try:
                    os.read(self._wake_read, 64)
                except BlockingIOError:
                    pass
                continue
            try:
                if client is None:
                    self._accept()
                elif not client.gone:
                    if events & selectors.EVENT_WRITE:
                        client.flush()
                    if events & selectors.EVENT_READ and client not in self.pending:
                        self._read(client)
            except Exception as exc:  # a fault of this server's: it ends one connection, not all
                self.log(f"{type(exc).__name__} on a connection: {exc}")
                if client is not None:
                    client.end("")
            self._settle()
        for client in list(self.pending):
            self._work(client)
            self._settle()
        if not self.accepting and time.monotonic() >= self._accept_again:
            self.selector.register(self.listener, selectors.EVENT_READ, None)
            self.accepting = True
        if busy or self.busy():
            self.evaluate()
            self._settle()
        if self.clients:
            self._quiet_since = time.monotonic()
        elif (self.idle_after is not None and time.monotonic() - self._quiet_since >= self.idle_after
              and self.idle()):
            self.stopping = True

    def _settle(self) -> None:
        """Drop the connections that ended; wait for writability where answers are queued."""
        while self.dirty:
            client: Any = self.dirty.pop()
            if not self._holds(client):
                continue
            if client.gone:
                self._drop(client)
                continue
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.out else 0)
            if events != client.events:
                self.selector.modify(client.sock, events, client)
                client.events = events

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stop()

    def stop(self) -> None:
        """From a signal handler or another thread: the loop ends at once."""
        self.stopping = True
        try:
            os.write(self._wake_write, b"x")
        except OSError:  # full (already nudged) or closed (already ended)
            pass

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:  # the connection waits in the backlog meanwhile
                self.log(f"cannot accept ({exc.strerror}): not accepting for {ACCEPT_PAUSE:g}s")
                self.selector.unregister(self.listener)
                self.accepting = False
                self._accept_again = time.monotonic() + ACCEPT_PAUSE
            return  # else: that caller gave up before it was accepted
        try:
            sock.setblocking(False)
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            sock.close()
            return
        pid, uid, _gid = struct.unpack("3i", creds)
        refusal = ""
        if len(self.clients) >= self.max_clients:
            refusal = f"the {self.name} holds {len(self.clients)} connections, its most"
        elif self.per_uid.get(uid, 0) >= self.max_per_uid:
            refusal = (f"uid {uid} has {self.per_uid[uid]} connections to the {self.name}, "
                       "the most one user may hold")
        made: Any = None
        if not refusal:
            self.seq += 1
            try:
                made = self.connection(sock, uid, pid, self.seq)
            except ValueError as exc:
                refusal = str(exc)
        if made is None:
            try:
                sock.send(self.frame({"error": refusal}))
            except OSError:
                pass
            sock.close()
            return
        self.clients[made.fd] = made
        self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
        self.selector.register(sock, selectors.EVENT_READ, made)

    def _read(self, client: Any) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            client.end("")
            return
        client.buf += data
        self._work(client)
        if b"\n" not in client.buf and len(client.buf) > MAX_REQUEST:
            client.send({"error": "request too long"})
            client.end("request too long")

    def _work(self, client: Any) -> None:
        """Handle up to ``BATCH`` of the caller's whole lines; the rest wait for the next turn."""
        self.pending.discard(client)
        for _ in range(BATCH):
            if client.gone or b"\n" not in client.buf:
                return
            line, _, client.buf = client.buf.partition(b"\n")
            self._request(client, line)
        if not client.gone and b"\n" in client.buf:
            self.pending.add(client)

    def _request(self, client: Any, line: bytes) -> None:
        if len(line) > MAX_REQUEST:
            client.send({"error": "request too long"})
            client.end("request too long")
            return
        try:
            message = decode(line)
        except (ValueError, RecursionError):
            client.send({"error": "not a JSON object"})
            client.end("not a JSON object")
            return
        try:
            answer = self.handle(client, message)
        except self.request_errors as exc:
            answer = self.refusal(exc)
        except Exception as exc:  # anything else: this request's connection ends, the server goes on
            self.log(f"{type(exc).__name__} handling a request of uid {client.uid}: {str(exc)[:200]}")
            client.send({"error": f"the {self.name} could not handle this request "
                                  f"({type(exc).__name__})"})
            client.end(type(exc).__name__)
            return
        if answer is not None:
            client.send(answer)

    def _holds(self, client: Any) -> bool:
        """Whether ``client`` is still a connection of this loop's (not one dropped, its fd reused)."""
        return self.clients.get(client.fd) is client

    def _drop(self, client: Any, evaluate: bool = True) -> None:
        if not self._holds(client):
            return
        del self.clients[client.fd]
        self.per_uid[client.uid] -= 1
        if not self.per_uid[client.uid]:
            del self.per_uid[client.uid]
        self.pending.discard(client)
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        client.gone = client.gone or "closed"
        self.dropped(client)
        if evaluate:
            self.evaluate()
