"""A run's side of the admission engine (``dispatch.local.engine.admitd``): reach it, starting it when no
engine answers (``dispatch.local.engine.reach``), book, wait in a read until it says ``admitted``,
release.

Starting is under an flock on ``state_dir/admitd.lock``, so two runs at once start one engine; the
engine is started detached (its own session, ``/`` as its directory, no descriptor of the run's)
and given the run's settings on stdin, and answers ``ready`` once it listens. When it cannot be
started the run ends 78 (``EngineError``), before anything ran: never an unbooked run.

When the engine dies while a run waits, the run reaches the next one (starting it) and re-attaches
its booking, which the ledger kept with its place in the queue.

Round trips: a run's ``hello`` (the protocol check) goes out with its first request and is read
before that request's answer; the job cgroup's ``cgroup`` is not waited for (its answer is read
before the next one); the record goes with the ``release``. A lone ``hostrun -- true`` waits on the
engine twice: booked (``queued``, then ``admitted``) and released.
"""

from __future__ import annotations

# _socket, the C module, not socket: its classes and enums (~3 ms to import, with selectors and
# array) are more than a run's one Unix-socket connection needs
import _socket
import os
import time

from dispatch.core.errors import EngineError, EngineNotStartedError, HostrunError, LedgerError
from dispatch.local.engine.reach import PROTOCOL, digest_of, lock_path, socket_path, spawn, try_connect

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence
    from typing import Any

    from dispatch.core.engineshape import (
        AdmissionFields,
        EngineWhere,
        RecordFields,
        Reply,
        Request,
        RunFields,
    )
    from dispatch.core.settings import Settings
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.admission.policy import Admission
    from dispatch.local.store.ledgerdb import RunRecord

START_TRIES = 5  # engines started in turn (one killed as it starts) before a run gives up, 78
REACH_TRIES = 10  # tries to reach an engine (one that died, one dying as it was reached) before 78
COMMAND_MAX = 4096  # characters of a run's command line kept in its booking (shown, never run)



def encode_request(message: Request) -> bytes:
    """One request as a JSON line, ASCII only, without the ``json`` module (and its ``re``: a plain
    run imports neither): ``jsontext.dumps``."""
    from dispatch.core.jsontext import dumps

    return dumps(message, line=True).encode("ascii") + b"\n"


def where(settings: Settings) -> EngineWhere:
    """Where the engine of these settings runs (``hostrun doctor``): its socket, and the pid it
    answers with, or None when none answers (the next run starts it)."""
    path = socket_path(settings.state_dir, digest_of(settings)[0])
    try:
        sock = try_connect(path)
    except HostrunError as exc:
        return {"socket": path, "pid": None, "detail": str(exc)}
    if sock is None:
        return {"socket": path, "pid": None, "detail": "not running: the next run starts it"}
    link = Link(settings, lambda _: None)
    link.sock = sock
    try:
        pid = link.ask({"op": "hello", "protocol": PROTOCOL}).get("pid")
    except (OSError, HostrunError) as exc:
        return {"socket": path, "pid": None, "detail": f"does not answer: {exc}"}
    finally:
        link.close()
    return {"socket": path, "pid": pid, "detail": f"running, pid {pid}"}


class Link:
    """One connection to the engine of ``settings``' state dir; ``connect`` makes it."""

    def __init__(self, settings: Settings, say: Callable[[str], None]) -> None:
        self.settings = settings
        self.say = say
        self.digest, self.data = digest_of(settings)
        self.sock: _socket.socket | None = None
        self.buf = b""
        self.booking_id: int | None = None
        self.admitted_kind: str | None = None  # the kind the engine admitted it as (lent: gamble)
        self.gpu: list[Any] | None = None  # a --gpu-memory run's [VRAM, device indices], as planned
        self.gpu_index: int | None = None  # the GPU the engine admitted it on
        self.attached: Reply | None = None  # the last attach's answer
        self.greeting = False  # a new connection: its hello goes with the first request (``send``)
        self.owed = 0  # answers not yet read (a ``cgroup``'s): read before the next one (``ask``)
        self.record: tuple[RecordFields, Callable[[Ledger], None]] | None = None  # for ``release``

    # -- reaching the engine ----------------------------------------------------------------------

    def connect(self) -> Link:
        """Reach the engine, starting it when none answers. Its ``hello`` goes with the first
        request (``send``): an engine that dies as it is reached (its socket still there, or reset
        at the greeting) fails that request, which is tried again on a new connection."""
        path = self.address()
        failed_starts = 0
        last: Exception | None = None
        for _ in range(REACH_TRIES):
            self.close()
            try:
                sock = try_connect(path)
                if sock is None:
                    sock = self._start(path)
            except EngineNotStartedError as exc:  # killed as it started, or cannot: 78 after a few
                failed_starts += 1
                if failed_starts >= START_TRIES:
                    raise
                last = exc
                continue
            self.sock, self.buf, self.greeting = sock, b"", True
            return self
        raise EngineError(f"cannot reach the admission engine at {path} ({last}); nothing ran")

    def address(self) -> str:
        """Where the engine listens."""
        return socket_path(self.settings.state_dir, self.digest)

    def _start(self, path: str) -> _socket.socket:
        import fcntl

        lock = lock_path(self.settings.state_dir)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # a read-only or full state dir: its own words, 78
            raise LedgerError.of_state_dir(self.settings.state_dir, exc, str(exc),
                                           f"admission engine lock {lock}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            sock = try_connect(path)  # another run started it while this one waited for the lock
            if sock is not None:
                return sock
            said = spawn(self.settings.state_dir, self.digest, self.data)
            sock = try_connect(path)
            if sock is None:
                raise EngineNotStartedError(f"the admission engine did not start: {said}; nothing ran")
            return sock
        finally:
            os.close(fd)

    # -- messages ---------------------------------------------------------------------------------

    def send(self, message: Request) -> None:
        """On a new connection, the ``hello`` goes first in the same write, and its answer (the
        first on a connection) is read and checked before anything else."""
        if self.sock is None:
            raise ConnectionError("not connected")
        if not self.greeting:
            self.sock.sendall(encode_request(message))
            return
        self.greeting = False
        self.sock.sendall(encode_request({"op": "hello", "protocol": PROTOCOL}) + encode_request(message))
        hello = self.receive()
        if hello.get("op") != "hello" or hello.get("protocol") != PROTOCOL:
            raise EngineError(f"the admission engine at {self.address()} speaks another protocol: "
                              f"{hello}")

    def _receive(self, timeout: float | None = None) -> Reply:
        """The next message (``marshal``, after its length in 4 bytes: the engine is this user's own
        process, and a run needs no JSON parser); ConnectionError when the engine is gone.
        ``timeout``: seconds to wait for it at most (``_socket.timeout`` then; what came of it so
        far is kept for the next read)."""
        import marshal

        if self.sock is None:
            raise ConnectionError("not connected")
        if timeout is not None:
            self.sock.settimeout(max(timeout, 0.001))
        try:
            while len(self.buf) < 4 or len(self.buf) < 4 + int.from_bytes(self.buf[:4], "big"):
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("the admission engine closed the connection")
                self.buf += data
        finally:
            if timeout is not None and self.sock is not None:
                self.sock.settimeout(None)
        size = int.from_bytes(self.buf[:4], "big")
        message: Reply = marshal.loads(self.buf[4:4 + size])
        self.buf = self.buf[4 + size:]
        if not isinstance(message, dict):
            raise ConnectionError("the admission engine sent something that is not a message")
        if "error" in message:
            if message.get("kind") == "ledger":  # the state dir's own trouble, in its own words
                raise LedgerError(str(message["error"]))
            refusal = _refusal_class(message.get("class"))
            if refusal is not None:  # the run's own refusal (243, 78), as the run would raise it
                raise refusal(str(message["error"]))
            raise EngineError(f"the admission engine refused: {message['error']}")
        return message

    def receive(self, timeout: float | None = None) -> Reply:
        """The next message for this run; what the engine has to say meanwhile (a ledger recovered
        and this run's booking put back) is said on the way. ``timeout``: as ``_receive``'s."""
        while True:
            message = self._receive(timeout)
            if message.get("op") != "say":
                return message
            self.say(str(message.get("line", "")))

    def ask(self, message: Request) -> Reply:
        """Send, and read the answer (after those owed: a ``cgroup``'s, whose refusal changes
        nothing, as ``set_cgroup`` says)."""
        self.send(message)
        while self.owed:
            self.owed -= 1
            try:
                self.receive()
            except LedgerError:  # its refusal (EngineError among them): the job runs on
                pass
        return self.receive()

    # -- a run's booking --------------------------------------------------------------------------

    def plan(self, fields: RunFields) -> Reply:
        """Queue the run before anything of it is made: the engine checks its cap (raising the
        run's 243 or 78 here), plans its booking and answers ``queued`` with the booking id and the
        plan (``booking.Plan`` as a list)."""
        if len(fields["command"]) > COMMAND_MAX:  # an ARG_MAX-long line would pass the request bound
            fields = {**fields, "command": fields["command"][:COMMAND_MAX - 1] + "…"}
        request: Request = {"op": "plan", "run": fields, "status_interval": self.settings.status_interval}
        for attempt in range(REACH_TRIES):
            try:
                answer = self.ask(request)
                break
            except (ConnectionError, BrokenPipeError):  # gone as it was reached, or before it queued
                time.sleep(0.05 * attempt)
                self.connect()
        else:
            raise EngineError("the admission engine kept going away before it queued this run; "
                              "nothing ran")
        self.booking_id = int(answer["id"])
        return answer

    def set_cgroup(self, path: str) -> None:
        """The admitted run's job cgroup, made now: its booking names it. Not waited for: its
        answer is read before the next one (``ask``). An engine gone by then, or a refusal, is no
        loss (the next run's recovery finds the job by its cgroup); the release goes on."""
        if self.booking_id is None or not path:
            return
        try:
            self.send({"op": "cgroup", "id": self.booking_id, "path": path})
            self.owed += 1
        except (ConnectionError, OSError):
            pass

    def wait(self, say: Callable[[str], None], on_wait: Callable[[Admission], None] | None,
             due: Callable[[], bool] | None = None, park: Callable[[], bool] | None = None,
             started: float | None = None, park_after: float = 0.0,
             ready: Callable[[], None] | None = None) -> float:
        """Block until admitted (seconds waited since ``started``, a ``time.monotonic``); each
        ``wait`` message is a status line, as the engine wrote it, and ``on_wait``'s figures when
        ``due()`` says it wants them now (a short wait then builds none, nor imports what they
        take). Once the run has waited ``park_after`` seconds and the last one said it is not near
        its turn, ``park`` is called, once (it execs ``dispatch.local.engine.park``'s parked process, or
        returns when the run stays whole: the engine declines a run whose turn is near by then). An
        engine that dies meanwhile is replaced and the booking attached. ``ready`` is called once,
        when the engine says the run's turn is near (``soon``): what the run needs once admitted is
        loaded then, so that a freed slot is taken without it."""
        started = time.monotonic() if started is None else started
        tries = 0
        far = False  # the last status said the run is not near its turn
        while True:
            timeout = None
            if park is not None and far:
                timeout = started + park_after - time.monotonic()
                if timeout <= 0:
                    go, park = park, None  # asked once
                    go()
                    continue
            try:
                message = self.receive(timeout)
            except _socket.timeout:  # time to park (TimeoutError; an OSError before Python 3.10)
                continue
            except (ConnectionError, OSError) as exc:
                tries += 1
                if tries > REACH_TRIES:
                    raise EngineError(f"the admission engine went away {tries - 1} times while this run "
                                      f"waited ({exc}); nothing ran") from None
                try:
                    self._reattach()
                except (ConnectionError, OSError):
                    time.sleep(0.1)  # the next receive fails at once and tries again
                continue
            op = message.get("op")
            if op == "admitted":
                kind, index = message.get("kind"), message.get("gpu_index")
                self.admitted_kind = kind if isinstance(kind, str) else None
                if isinstance(index, int):
                    self.gpu_index = index
                return time.monotonic() - started
            if op == "soon" and ready is not None:
                get_ready, ready = ready, None
                get_ready()
                continue
            if op == "wait":
                line = message.get("line")
                if isinstance(line, str):
                    say(line)
                if on_wait is not None and (due is None or due()):
                    on_wait(_admission(message["adm"]))
                far = message.get("near") is False

    def park_request(self, booking_id: int) -> bool:
        """Ask the engine to mark the booking parked (``dispatch.local.engine.park``): True once it has.
        False when the run stays whole: the engine declined (its turn is near by now), or an
        ``admitted`` or ``soon`` came first, put back for ``wait`` to read. Every answer to this
        request is read here, so none is taken later for another's."""
        self.send({"op": "park", "id": booking_id})
        first: Reply | None = None
        parked = False
        while True:
            try:
                message = self._receive()
            except EngineError:  # refused: admitted before the engine read the request
                if first is None:
                    raise
                break
            op = message.get("op")
            if op == "parked":
                parked = message.get("parked") is not False
                break
            if op in ("wait", "say") and isinstance(message.get("line"), str):
                self.say(str(message["line"]))
            elif op in ("admitted", "soon") and first is None:
                first = message
        if first is not None:
            self.buf = _framed(first) + self.buf
        return parked and first is None

    def adopt(self, fd: int, booking_id: int) -> Link:
        """The connection a parked run handed on (``park.take_resume``), its booking with it."""
        self.sock = _socket.socket(fileno=fd)
        os.set_inheritable(fd, False)
        self.buf, self.booking_id, self.greeting = b"", booking_id, False
        return self

    def attach(self) -> Reply:
        """This connection's booking, as the engine has it (``state``: waiting, running or gone;
        ``plan``), its status interval set again. On a connection a parked run handed on, what the
        engine sent before the answer is read first: waiting lines said, the rest dropped (the
        answer's state says whether it was admitted)."""
        assert self.booking_id is not None
        self.send({"op": "attach", "id": self.booking_id, "status_interval": self.settings.status_interval,
                   "gpu": self.gpu})
        while True:
            message = self.receive()
            if message.get("op") == "attached":
                index = message.get("gpu_index")
                if isinstance(index, int):
                    self.gpu_index = index
                return message
            if message.get("op") == "wait" and isinstance(message.get("line"), str):
                self.say(str(message["line"]))

    def reattached(self) -> Reply:
        """The booking through the next engine (this one went), tried as a waiting run tries
        (engines may die as they are reached); its ``attach`` answer."""
        last: Exception | None = None
        for _ in range(REACH_TRIES):
            try:
                self._reattach()
                return self.attached or {}
            except (ConnectionError, OSError) as exc:
                last = exc
                time.sleep(0.1)
        raise EngineError(f"the admission engine kept going away while this run waited ({last}); "
                          "nothing ran")

    def _reattach(self) -> None:
        assert self.booking_id is not None
        self.close()
        self.connect()
        answer = self.attached = self.attach()
        if answer.get("state") == "gone":
            raise EngineError(f"booking {self.booking_id} was lost while the admission engine restarted; "
                              "nothing ran")
        if answer.get("state") == "running":  # admitted just before the old engine died
            self.buf = _framed({"op": "admitted"}) + self.buf

    # -- the run's record: the engine writes it (``runrecord.record_outcome`` calls these) ----------

    def record_run(self, run: RunRecord, keep: tuple[float, int]) -> None:
        self._record({"call": "run", "run": _run_fields(run)}, lambda ledger: ledger.record_run(run, keep))

    def record_peak(self, label: str, host: str, peak: int, hit_ceiling: bool, duration: float, *,
                    cap: int | None, event: str, clear_after: int, run: RunRecord | None = None,
                    keep: tuple[float, int], vram: int | None = None,
                    ramp: Sequence[int] | None = None) -> None:
        self._record(
            {"call": "peak", "run": None if run is None else _run_fields(run), "peak": peak,
             "hit_ceiling": hit_ceiling, "duration": duration, "cap": cap, "event": event,
             "vram": vram, "ramp": None if ramp is None else list(ramp)},
            lambda ledger: ledger.record_peak(label, host, peak, hit_ceiling, duration, cap=cap,
                                              event=event, clear_after=clear_after, run=run, keep=keep,
                                              vram=vram, ramp=ramp))

    def _record(self, fields: RecordFields, direct: Callable[[Ledger], None]) -> None:
        """The run's peak and history row, kept for its ``release``, which carries it to the engine:
        written there in the ledger it holds open (a finished run neither opens the ledger nor
        waits on its lock), then the booking released, in one answer; when the engine has gone,
        both written here (``direct``). A record the ledger refuses is one warning either way."""
        self.record = (fields, direct)

    def release(self) -> None:
        """Give the booking back, with the run's record when it has one (through the engine; through
        the ledger itself when the engine went, or when it could not release)."""
        booking_id, self.booking_id = self.booking_id, None
        record, self.record = self.record, None
        if booking_id is None:
            return
        message: Request = {"op": "release", "id": booking_id}
        if record is not None:
            message["record"] = record[0]
        try:
            if self.sock is None:
                raise ConnectionError("not connected")
            self.ask(message)
            return
        except (ConnectionError, OSError):  # the engine gone: the record too is written here
            pass
        except EngineError as exc:  # refused, nothing written: the record is one warning
            if record is not None:
                from dispatch.local.store.runrecord import unrecorded_line

                self.say(unrecorded_line(exc))
            record = None
        except LedgerError:  # it could not release: the record was its to write (or to warn of)
            record = None
        from dispatch.local.admission.ledger import Ledger

        ledger = Ledger(self.settings.state_dir, self.say)
        try:
            if record is not None:
                try:
                    record[1](ledger)
                except LedgerError as exc:
                    from dispatch.local.store.runrecord import unrecorded_line

                    self.say(unrecorded_line(exc))
            ledger.release(booking_id)
        finally:
            ledger.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.greeting, self.owed = False, 0


def _framed(message: Reply) -> bytes:
    """A message as the engine sends it: its length in 4 bytes, then ``marshal``."""
    import marshal

    data = marshal.dumps(dict(message))
    return len(data).to_bytes(4, "big") + data


def _run_fields(run: RunRecord) -> list[Any]:
    """A history row as the engine takes it (``RunRecord``'s fields; its command kept short)."""
    fields = list(run)[:15]
    if len(run.command) > COMMAND_MAX:
        fields[7] = run.command[:COMMAND_MAX - 1] + "…"
    return fields


def _refusal_class(name: object) -> type[HostrunError] | None:
    """The error class an engine's refusal names, when it is one of hostrun's own (a run's 243, 78)."""
    from dispatch.core import errors

    found = getattr(errors, name, None) if isinstance(name, str) and name.endswith("Error") else None
    return found if isinstance(found, type) and issubclass(found, HostrunError) else None


def _admission(data: AdmissionFields) -> Admission:
    from dispatch.local.admission.policy import Admission
    from dispatch.local.store.ledgerdb import Booking

    return Admission(**data)._replace(holders=[Booking(*b) for b in data["holders"]],
                                      reclaimed=[Booking(*b) for b in data["reclaimed"]])
