"""The shared slice's engine (``dispatch.local.shared.sharedd``) here, fast: its rules against real callers.

What is real: the engine's code and loop (the admission engine's, ``dispatch.local.engine.admitd``), its
ledger (SQLite in a private state dir), its Unix socket, the kernel's ``SO_PEERCRED``, real processes
(a root client and a real second local user's client, ``other_user``), ``/proc`` facts and pidfds.
What is FAKE: systemd (``tests/fakesystemd.FakeManager`` records the calls; no process is moved, no
cgroup made) and the slice's cgroup files (a directory with ``memory.*`` files this test writes). The
real systemd and cgroup v2 side, with real users, is ``tests/vm/test_vm_shared.py``.
"""

from __future__ import annotations

import json
import marshal
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch.capping.systemd import Manager
from dispatch.core.procinfo import start_time
from dispatch.core.settings import Settings
from dispatch.core.units import MiB
from dispatch.local.shared.sharedd import SharedEngine, SliceKeeper
from dispatch.local.store.ledgerdb import NewBooking
from tests.conftest import OtherUser, wait_for
from tests.support.fakesystemd import FakeManager

LIMIT = 400 * MiB


def run_fields(label: str, cap: int, pid: int | None = None) -> dict[str, Any]:
    """A run's ``plan`` fields (``requests.RUN_FIELDS``), as hostrun sends them."""
    pid = os.getpid() if pid is None else pid
    return {"host": "local", "label": label, "pid": pid, "pid_start": start_time(pid) or 0, "cap": cap,
            "no_cap": False, "program": "sh", "command": "sh -c x", "session": None, "group": None,
            "when_idle": False, "booking_id": None, "requeue": False, "gamble": 50 * MiB,
            "gpu": None}


class Client:
    """A connection of this process (root here) to the engine: JSON lines out, its frames in."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        try:
            self.sock.connect(path)
        except OSError:  # e.g. the engine already stopped listening: no socket left open
            self.sock.close()
            raise
        self.buf = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self) -> dict[str, Any]:
        while len(self.buf) < 4 or len(self.buf) < 4 + int.from_bytes(self.buf[:4], "big"):
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        size = int.from_bytes(self.buf[:4], "big")
        message = marshal.loads(self.buf[4:4 + size])
        self.buf = self.buf[4 + size:]
        return message  # type: ignore[no-any-return]

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.receive()

    def until(self, op: str) -> dict[str, Any]:
        """The next message whose op is ``op`` (waiting lines and news before it skipped)."""
        while True:
            message = self.receive()
            if message.get("op") == op or "error" in message:
                return message

    def book(self, label: str, size: int) -> int:
        """Plan a run of ``label`` at cap ``size`` (no peak: booked at its cap); its booking id."""
        answer = self.ask({"op": "plan", "run": run_fields(label, size)})
        assert answer.get("op") == "queued", answer
        return int(answer["id"])

    def close(self) -> None:
        self.sock.close()


class Setup:
    def __init__(self, root: Path, left: tuple[str, ...] = (), booked: tuple[str, ...] = ()) -> None:
        """``left``: scope directories already in the slice when the engine starts (an engine before
        it died with their jobs running); ``booked``: those of them the ledger has a running booking
        for (held by this test process, which lives)."""
        self.root = root
        self.slice = root / "cg" / "hostrun.slice"
        self.slice.mkdir(parents=True)
        for name, text in (("memory.current", "0"), ("memory.max", str(LIMIT)),
                           ("memory.stat", "anon 0\nshmem 0\nfile 0\n")):
            (self.slice / name).write_text(text + "\n")
        for unit in left:
            (self.slice / unit).mkdir()
        self.fake = FakeManager(str(root / "systemd-private"))
        self.manager = Manager(self.fake.path, "", False)
        self.backend = SliceKeeper(str(root / "cg"), "hostrun.slice", self.manager)
        state = root / "state"
        state.mkdir(mode=0o700)
        self.settings = Settings.default(state_dir=str(state))
        if booked:
            from dispatch.local.admission.ledger import Ledger

            ledger = Ledger(str(state))
            for i, unit in enumerate(booked):
                me = os.getpid()
                booking_id = ledger.enqueue(NewBooking(
                    host="local", label=f"root:old{i}", pid=me, pid_start=start_time(me) or 0, size=MiB,
                    cap=MiB, kind="cap", command="old", session=None, cgroup=str(self.slice / unit)))
                ledger.db.execute("UPDATE bookings SET state = 'running' WHERE id = ?", (booking_id,))
            ledger.close()
        self.path = str(root / "shared.sock")
        self.clients: list[Client] = []
        self.start()

    def start(self) -> None:
        """An engine on the socket path and the state dir, in a thread (again: a restart)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o777)  # the group's 0660 in real life: here any user may connect
        listener.listen(1024)
        self.daemon = SharedEngine(listener, self.settings, self.path, "hostrun.slice", LIMIT, "staff",
                                   self.backend, self.manager)
        self.thread = threading.Thread(target=self.daemon.serve, kwargs={"handle_signals": False},
                                       daemon=True)
        self.thread.start()

    def client(self) -> Client:
        client = Client(self.path)
        self.clients.append(client)  # closed at teardown (closing twice is harmless)
        return client

    def listing(self) -> list[dict[str, Any]]:
        return self.client().ask({"op": "list"})["bookings"]  # type: ignore[no-any-return]

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.daemon.stop()
        try:
            Client(self.path).close()  # wakes the loop
        except OSError:
            pass
        self.thread.join(10)
        self.manager.close()
        self.fake.close()


@pytest.fixture
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Setup]:
    os.chmod(tmp_path, 0o755)
    for parent in tmp_path.parents:  # the other user must reach the socket
        if parent == Path("/"):
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
    s = Setup(tmp_path, *getattr(request, "param", ()))
    try:
        yield s
    finally:
        s.close()
    assert not s.thread.is_alive(), "the engine's loop did not end"


OTHER_CLIENT = textwrap.dedent("""\
    import json, marshal, os, socket, sys, time
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    buf = b""
    def receive():
        global buf
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            data = s.recv(65536)
            if not data:
                return {"closed": True}
            buf += data
        n = int.from_bytes(buf[:4], "big")
        m = marshal.loads(buf[4:4 + n])
        buf = buf[4 + n:]
        return m
    start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    for line in sys.stdin:
        m = json.loads(line)
        if m.get("op") == "plan":  # the fields of this very process
            m["run"] = dict(m["run"], pid=os.getpid(), pid_start=start)
        if m.get("op") == "child":  # a child of this process, for a scope
            pid = os.fork()
            if pid == 0:  # as hostrun's job would after its exec: not holding the connection
                os.close(s.fileno()); os.close(1); time.sleep(60); os._exit(0)  # stdout: the test's pipe
            m = {"op": "scope", "id": m["id"], "pids": [pid]}
        if m.get("op") != "read":
            s.sendall(json.dumps(m).encode() + b"\\n")
        print(json.dumps(receive()), flush=True)
""")


class OtherClient:
    """A connection of the real second local user: a process of theirs (the system python3: the
    test's own interpreter may sit in root's home), speaking a line at a time."""

    def __init__(self, user: OtherUser, path: str) -> None:
        script = user.home / "client.py"
        script.write_text(OTHER_CLIENT)
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", str(script), path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, user=user.uid, group=user.gid, extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "HOME": str(user.home)})

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())  # type: ignore[no-any-return]

    def read(self) -> dict[str, Any]:
        """The next message the engine sent this connection (no request)."""
        return self.ask({"op": "read"})

    def until(self, op: str) -> dict[str, Any]:
        """The next message whose op is ``op`` (a waiter's ``soon`` before it skipped)."""
        while True:
            message = self.read()
            if message.get("op") == op or "error" in message:
                return message

    def close(self) -> None:
        self.proc.kill()
        self.proc.communicate()  # and its pipes closed


def test_one_queue_for_every_user_first_come_first_served(setup: Setup, other_user: OtherUser) -> None:
    """root holds 300M of 400M; the other user's 300M waits and is told who holds the room (its
    label after its user's name); a later 150M of root's waits behind it although it would fit
    (it does not fit beside root's first); when root's first connection closes, the other user's is
    admitted, and root's later one when that one ends. Identity is the kernel's: the
    other user's hello says its own uid, and its booking is kept under its own name."""
    first = setup.client()
    first.book("first", 300 * MiB)
    assert first.until("admitted")["size"] == 300 * MiB
    other = OtherClient(other_user, setup.path)
    try:
        assert other.ask({"op": "hello", "protocol": 2, "uid": 0})["uid"] == other_user.uid
        queued = other.ask({"op": "plan", "run": run_fields("second", 300 * MiB)})
        assert queued["op"] == "queued", queued
        news = other.until("wait")
        assert news["op"] == "wait" and "root:first" in news["line"], news
        late = setup.client()
        late.book("late", 150 * MiB)
        assert late.until("wait")["op"] == "wait"
        listing = setup.listing()
        assert [(b["user"], b["label"], b["state"]) for b in listing] == [
            ("root", "first", "running"), (other_user.name, "second", "waiting"),
            ("root", "late", "waiting")]
        first.close()
        assert other.until("admitted")["op"] == "admitted"
        assert [(b["label"], b["state"]) for b in setup.listing()] == [
            ("second", "running"), ("late", "waiting")]
    finally:
        other.close()
    assert late.until("admitted")["op"] == "admitted"
    wait_for(lambda: [b["label"] for b in setup.listing()] == ["late"])


def test_labels_are_each_users_own_and_nobody_takes_anothers_booking(setup: Setup,
                                                                     other_user: OtherUser) -> None:
    """The same label from two users is two labels in the engine's ledger (``user:label``: their
    peaks and marks apart); the other user cannot attach root's booking, nor release it, nor ask a
    scope for it."""
    mine = setup.client()
    booking_id = mine.book("same", 10 * MiB)
    mine.until("admitted")
    other = OtherClient(other_user, setup.path)
    try:
        assert other.ask({"op": "plan", "run": run_fields("same", 10 * MiB)})["op"] == "queued"
        assert other.read()["op"] == "admitted"
        for request in ({"op": "attach", "id": booking_id}, {"op": "release", "id": booking_id},
                        {"op": "scope", "id": booking_id, "pids": [os.getpid()]}):
            answer = other.ask(request)
            assert "error" in answer, (request, answer)
    finally:
        other.close()
    labels = sorted(b.label for b in setup.daemon.ledger.bookings("local"))
    assert "root:same" in labels and all(label.count(":") >= 1 for label in labels), labels
    assert [b["state"] for b in setup.listing() if b["user"] == "root"] == ["running"]


def test_a_scope_holds_only_the_callers_own_children(setup: Setup, other_user: OtherUser) -> None:
    """No scope before admission; once admitted, the other user may not put root's process (a
    child of this test) in its scope; its own child is accepted, in a scope named after its
    booking's holder with the engine's properties and the booking's cap, and killed when it leaves."""
    mine = subprocess.Popen(["sleep", "60"])
    other = OtherClient(other_user, setup.path)
    try:
        blocker = setup.client()
        blocker.book("blocker", LIMIT)
        blocker.until("admitted")
        queued = other.ask({"op": "plan", "run": run_fields("x", 200 * MiB)})
        early = other.ask({"op": "scope", "id": queued["id"], "pids": [mine.pid]})
        while early.get("op") in ("wait", "soon"):
            early = other.read()
        assert "not an admitted booking" in early["error"], early
        other.close()
        blocker.close()
        other = OtherClient(other_user, setup.path)
        queued = other.ask({"op": "plan", "run": run_fields("x", 200 * MiB)})
        assert other.read()["op"] == "admitted"
        refused = other.ask({"op": "scope", "id": queued["id"], "pids": [mine.pid]})
        assert "is not a child of the caller" in refused["error"]
        assert "StartTransientUnit" not in setup.fake.members()
        started = other.ask({"op": "child", "id": queued["id"]})
        holder = other.proc.pid  # the booking's holder: the other user's client process
        assert started["unit"] == f"hostrun-shared-{holder}-{start_time(holder)}.scope", started
        (body,) = [b for m, b in setup.fake.calls if m == "StartTransientUnit"]
        props = dict(body[2])
        assert props["Slice"] == ("s", "hostrun.slice") and props["MemoryMax"] == ("t", 200 * MiB)
        assert props["MemorySwapMax"] == ("t", 0) and props["OOMPolicy"] == ("s", "stop")
        (row,) = [b for b in setup.listing() if b["label"] == "x"]
        assert row["unit"] == started["unit"] and row["user"] == other_user.name
    finally:
        other.close()
        mine.kill()
        mine.wait()
    wait_for(lambda: ("KillUnit", [started["unit"], "all", 9]) in setup.fake.calls)
    for pid in (int(p) for p in subprocess.run(["pgrep", "-u", str(other_user.uid), "sleep"],
                                               capture_output=True, text=True).stdout.split()):
        os.kill(pid, signal.SIGKILL)  # the fake manager kills nothing: the test does


def test_bad_requests_get_one_line_and_nothing_is_booked(setup: Setup) -> None:
    c = setup.client()
    too_big = c.ask({"op": "plan", "run": run_fields("big", LIMIT + 1)})
    assert "larger than" in too_big["error"] and too_big["class"] == "NeverFitsError", too_big
    bad = run_fields("x", MiB)
    bad["cap"] = "1G"
    assert "cap of the wrong type" in c.ask({"op": "plan", "run": bad})["error"]
    assert "unknown request" in c.ask({"op": "unbook", "uid": 0})["error"]
    assert "scope this engine starts" in c.ask({"op": "cgroup", "id": 1, "path": "/x"})["error"]
    c.sock.sendall(b"not json\n")
    assert c.receive() == {"error": "not a JSON object"}
    with pytest.raises((EOFError, ConnectionResetError)):
        c.receive()
    wait_for(lambda: [b for b in setup.listing() if b["label"] != "x"] == [])


def _alive(setup: Setup) -> None:
    """The daemon still answers a fresh connection (its loop is alive) and holds no booking."""
    assert setup.thread.is_alive(), "the daemon's loop died"
    assert setup.listing() == []


def _ended(client: Client) -> list[dict[str, Any]]:
    """The lines the daemon sent before it closed this connection."""
    lines = []
    with pytest.raises((EOFError, ConnectionResetError)):
        while True:
            lines.append(client.receive())
    return lines


def test_deep_nesting_and_long_lines_end_only_their_own_connection(setup: Setup) -> None:
    """100,000 ``[`` on one line (json.loads' RecursionError, before: the daemon died), 20,000 (under
    the request bound: the nesting itself), and a line that never ends: each ends its own connection
    with one line, and a booking held meanwhile on another connection stays."""
    holder = setup.client()
    holder.book("holder", 100 * MiB)
    holder.until("admitted")
    for payload in (b"[" * 100_000 + b"\n", b"[" * 20_000 + b"\n", b'{"op": "' + b"x" * 2_000_000):
        c = setup.client()
        try:
            c.sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it stopped reading at its bound: what it said before is still to be read
        (line,) = _ended(c)
        assert line["error"] in ("not a JSON object", "request too long"), line
        assert setup.thread.is_alive(), f"the daemon died on {payload[:20]!r}"
    (booking,) = setup.listing()
    assert booking["label"] == "holder" and booking["state"] == "running"
    holder.close()
    wait_for(lambda: setup.listing() == [])


def test_out_of_range_numbers_are_refused_with_one_line(setup: Setup) -> None:
    """A pid too large for a C long (before: OverflowError killed the daemon), a pid above the
    kernel's pid range, floats and booleans where bytes or ids are asked, NaN and infinities: each
    is refused on its connection, which stays usable; nothing is booked or started."""
    child = subprocess.Popen(["sleep", "60"])  # a child of this test: the caller's own
    try:
        c = setup.client()
        booking_id = c.book("numbers", MiB)
        c.until("admitted")
        for bad, said in (({"pids": [2 ** 63]}, "pids:"), ({"pids": [2 ** 70]}, "pids:"),
                          ({"pids": [1 << 23]}, "pids:"), ({"pids": [-5]}, "pids:"),
                          ({"pids": [child.pid, child.pid, child.pid]}, "pids:"),
                          ({"id": 2 ** 70}, "is not an admitted booking"), ({"id": 1.5}, "id:"),
                          ({"id": True}, "id:"), ({"unit": ["x"]}, "unit:"),
                          ({"unit": "hostrun-shared-0-١٢.scope"}, "unit:")):
            request = {"op": "scope", "id": booking_id, "pids": [child.pid], **bad}
            answer = c.ask(request)
            assert said in answer.get("error", ""), (bad, answer)
            assert setup.thread.is_alive(), f"the engine died on {bad}"
        for field, value in (("cap", 2 ** 64), ("cap", -1), ("cap", 1e9), ("cap", 10 ** 300),
                             ("label", ["x"] * 10), ("pid_start", float("nan")),
                             ("when_idle", "yes"), ("booking_id", 2 ** 70)):
            answer = c.ask({"op": "plan", "run": {**run_fields("odd", MiB), field: value}})
            assert "error" in answer, (field, value, answer)
        for extra in ({"status_interval": float("inf")}, {"status_interval": 10 ** 400},
                      {"status_interval": 0}):
            answer = c.ask({"op": "plan", "run": run_fields("odd", MiB), **extra})
            assert "status_interval" in answer.get("error", ""), (extra, answer)
        for op in (["x"] * 1000, {"a": 1}, None, 7, "x" * 5000):
            answer = c.ask({"op": op})
            assert "unknown request" in answer["error"] and len(answer["error"]) < 200, answer
        assert "StartTransientUnit" not in setup.fake.members()
        assert [b["label"] for b in setup.listing()] == ["numbers"]
        c.close()
    finally:
        child.kill()
        child.wait()
    wait_for(lambda: setup.listing() == [])


FLOOD = textwrap.dedent("""\
    import socket, sys
    path, count = sys.argv[1], int(sys.argv[2])
    held = []
    try:
        while len(held) < count:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            held.append(s)
    except OSError as exc:
        print("stopped at", len(held), exc, flush=True)
    print("holding", len(held), flush=True)
    sys.stdin.read()
""")


def test_running_out_of_descriptors_in_accept_does_not_kill_the_daemon(
        setup: Setup, tmp_path: Path) -> None:
    """More connections than the daemon has descriptors for (EMFILE in accept; before: the daemon
    died): it stops accepting for a moment, and answers again once they are gone. The descriptor
    limit is this test process's (the daemon is a thread of it), lowered for the flood only."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    flood = subprocess.Popen([sys.executable, str(script), setup.path, "200"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 40, hard))
        try:
            assert flood.stdout is not None
            assert flood.stdout.readline().startswith("holding")
            # it ran out, and stopped accepting for a while (before: its loop died here)
            wait_for(lambda: not getattr(setup.daemon, "accepting", True), timeout=30)
        finally:
            flood.communicate("")  # its connections close
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    finally:
        flood.kill()
        flood.wait()
    wait_for(lambda: setup.thread.is_alive() and len(setup.daemon.clients) == 0, timeout=30)
    _alive(setup)


def test_connections_are_limited_per_user(setup: Setup, other_user: OtherUser,
                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The other user holds as many connections as it may: its next is refused with one line
    naming the limit, while root (another uid) still connects and books."""
    monkeypatch.setattr(setup.daemon, "max_per_uid", 8)
    script = other_user.home / "flood.py"
    script.write_text(FLOOD)
    flood = subprocess.Popen(["/usr/bin/python3", str(script), setup.path, "8"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, user=other_user.uid,
                             group=other_user.gid, extra_groups=[],
                             env={"PATH": "/usr/bin:/bin", "HOME": str(other_user.home)})
    try:
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "holding 8"
        wait_for(lambda: len(setup.daemon.clients) == 8)
        # The ninth only reads: the daemon answers a refused connection at once and closes it, so
        # a hello written first could meet the closed socket (EPIPE) before the line is read.
        read_first = ("import json, marshal, socket, sys; s = socket.socket(socket.AF_UNIX); "
                      "s.connect(sys.argv[1]); f = s.makefile('rb'); n = int.from_bytes(f.read(4), 'big'); "
                      "print(json.dumps(marshal.loads(f.read(n))))")
        ninth = other_user.run(["/usr/bin/python3", "-c", read_first, setup.path], timeout=30)
        answer = json.loads(ninth.stdout)
        assert f"uid {other_user.uid} has 8 connections" in answer["error"], answer
        mine = setup.client()
        mine.book("root's", MiB)
        assert mine.until("admitted")["op"] == "admitted"
        mine.close()
    finally:
        flood.communicate("")
    wait_for(lambda: len(setup.daemon.clients) == 0)
    _alive(setup)


def test_a_flood_that_never_reads_its_answers_is_dropped_and_others_answered(setup: Setup) -> None:
    """4,000 pipelined requests never read (before: each answer past the socket's buffer blocked
    the one-threaded daemon 5 s in sendall, so this other caller's hello waited hours): another
    caller is answered while they queue; 40,000 more pass the output bound, and the flooder's
    connection is dropped (it reads fewer answers than it asked for, then the end)."""
    flooder = setup.client()
    flooder.sock.sendall(b'{"op":"list"}\n' * 4_000)
    other = setup.client()
    assert other.ask({"op": "hello", "protocol": 2})["protocol"] == 2
    try:
        flooder.sock.sendall(b'{"op":"list"}\n' * 40_000)
    except (BrokenPipeError, ConnectionResetError):
        pass  # dropped before it had sent them all
    lines = _ended(flooder)
    assert len(lines) < 44_000 and all("bookings" in line for line in lines)
    _alive(setup)


@pytest.mark.parametrize("setup", [(("hostrun-shared-77-1.scope", "hostrun-shared-5-2.scope",
                                     "hostrun-shared-6-3.scope", "other.scope"),
                                    ("hostrun-shared-6-3.scope",))], indirect=True)
def test_a_starting_engine_ends_only_the_scopes_no_running_booking_names(setup: Setup) -> None:
    """Scopes left in the slice whose bookings are gone run unbooked: the engine ends them as it
    starts. One a running booking of its ledger names (an engine before it died admitted it, and its
    run goes on) is kept, and so is a unit that is not hostrun's job."""
    assert [b["label"] for b in setup.listing()] == ["old0"]
    killed = sorted(b[0] for m, b in setup.fake.calls if m == "KillUnit")
    assert killed == ["hostrun-shared-5-2.scope", "hostrun-shared-77-1.scope"]


def test_a_booking_outlives_its_engine(setup: Setup) -> None:
    """The engine stops (killed, restarted by systemd) while a run holds a booking and another
    waits: the next engine on the same ledger has both, in their order; the waiter re-attaches and
    keeps its place, the holder releases through it, and then the waiter is admitted."""
    holder, waiter = setup.client(), setup.client()
    held = holder.book("held", LIMIT)
    holder.until("admitted")
    waiting = waiter.book("waits", MiB)
    waiter.until("wait")
    setup.daemon.stop()  # wakes its loop itself; the connection below only hurries a slow one
    try:
        Client(setup.path).close()
    except OSError:  # the loop ended first and closed its listener: a race this test does not test
        pass
    setup.thread.join(10)
    os.unlink(setup.path)
    setup.start()
    assert [(b["label"], b["state"]) for b in setup.listing()] == [("held", "running"), ("waits", "waiting")]
    back = setup.client()
    assert back.ask({"op": "attach", "id": waiting})["state"] == "waiting"
    mine = setup.client()
    assert mine.ask({"op": "attach", "id": held})["state"] == "running"
    assert mine.ask({"op": "release", "id": held})["op"] == "released"
    assert back.until("admitted")["id"] == waiting


def test_a_fuzz_from_two_users_leaves_the_booking_held_meanwhile(setup: Setup, other_user: OtherUser,
                                                                  tmp_path: Path) -> None:
    """The VM's fuzz (tests/support/sharedattack.py's script: malformed, oversized, deeply nested
    and out-of-range requests, pipelined floods never read) from root and the other user at once,
    more than 10,000 requests, while a booking is held and others are made and ended: the daemon's
    loop lives, the held booking is as it was, and every later booking is admitted."""
    from tests.support.sharedattack import ATTACK

    holder = setup.client()
    holder.book("held", 100 * MiB)
    holder.until("admitted")
    (before,) = setup.listing()
    mine, theirs = tmp_path / "attack.py", other_user.home / "attack.py"
    for path in (mine, theirs):
        path.write_text(ATTACK)
    env = {"PATH": "/usr/bin:/bin", "ATTACK_SOCKET": setup.path}
    fuzzers = [subprocess.Popen([sys.executable, str(mine), "fuzz", "1", "6000"], env=env,
                                stdout=subprocess.PIPE, text=True),
               subprocess.Popen(["/usr/bin/python3", str(theirs), "fuzz", "2", "6000"],
                                stdout=subprocess.PIPE, text=True, user=other_user.uid,
                                group=other_user.gid, extra_groups=[],
                                env={**env, "HOME": str(other_user.home)})]
    booked = 0
    while any(f.poll() is None for f in fuzzers):  # meanwhile bookings come and go
        c = setup.client()
        c.book("meanwhile", MiB)
        assert c.until("admitted")["op"] == "admitted"
        c.close()
        booked += 1
    sent = 0
    for f in fuzzers:
        out, _ = f.communicate()
        assert f.returncode == 0 and "malformed" in out, out
        sent += int(out.split("sent")[-1])
    assert sent >= 10_000 and booked
    assert setup.thread.is_alive()
    wait_for(lambda: [b["label"] for b in setup.listing()] == ["held"])
    assert setup.listing() == [before]


def test_the_shared_slice_speaks_the_engines_protocol() -> None:
    """A member's probe checks the hello of the shared slice's engine against ``capping.shared``'s
    number (below ``local/``, which it may not import): the two must be one."""
    from dispatch.capping.shared import PROTOCOL as SHARED
    from dispatch.local.engine.reach import PROTOCOL as ENGINE

    assert SHARED == ENGINE


def test_each_waiter_is_told_soon_once_when_its_turn_comes_near(setup: Setup) -> None:
    """With ``near`` = 2, the two waiters at the head of the queue are told ``soon`` at once (a whole
    run gets ready then, a parked one resumes), the third only once the head moved, after a status
    line that said it is not near; each is told once, before it is admitted."""
    setup.daemon.near = 2
    holder = setup.client()
    held = holder.book("held", LIMIT)
    holder.until("admitted")
    waiters = [setup.client() for _ in range(3)]
    ids = [w.book(f"w{i}", LIMIT) for i, w in enumerate(waiters)]
    heard: list[list[dict[str, Any]]] = [[] for _ in waiters]
    for i in (0, 1):
        heard[i].append(waiters[i].until("soon"))
    first = waiters[2].until("wait")
    assert first["near"] is False, first
    heard[2].append(first)
    for step, waiter in enumerate(waiters):
        releasing, released = (holder, held) if step == 0 else (waiters[step - 1], ids[step - 1])
        assert releasing.ask({"op": "release", "id": released})["op"] == "released"
        while not heard[step] or heard[step][-1].get("op") != "admitted":
            heard[step].append(waiter.receive())
    for i, messages in enumerate(heard):
        ops = [m["op"] for m in messages if m.get("id") == ids[i]]
        assert ops.count("soon") == 1, (i, ops)
        assert ops[-1] == "admitted" and ops.index("soon") < ops.index("admitted"), (i, ops)
    third = [m["op"] for m in heard[2]]
    assert third.index("wait") < third.index("soon"), third
