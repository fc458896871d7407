"""The shared slice's daemon (``dispatch.local.sharedd``) here, fast: its rules against real callers.

What is real: the daemon's code and loop, its Unix socket, the kernel's ``SO_PEERCRED``, real
processes (a root client and a real second local user's client, ``other_user``), ``/proc`` facts
and pidfds. What is FAKE: systemd (``tests/fakesystemd.FakeManager`` records the calls; no process
is moved, no cgroup made) and the slice's cgroup files (a directory with ``memory.*`` files this
test writes). The real systemd and cgroup v2 side, with real users, is ``tests/test_vm_shared.py``.
"""

from __future__ import annotations

import json
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

from dispatch.capping.systemd import Manager, SystemdBackend
from dispatch.core.units import MiB
from dispatch.local.sharedd import WAITING_MAX, Daemon
from tests.conftest import OtherUser, wait_for
from tests.support.fakesystemd import FakeManager

LIMIT = 400 * MiB


class Client:
    """A connection of this process (root here) to the daemon."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        try:
            self.sock.connect(path)
        except OSError:  # e.g. the daemon already stopped listening: no socket left open
            self.sock.close()
            raise
        self.buf = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)  # type: ignore[no-any-return]

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.receive()

    def close(self) -> None:
        self.sock.close()


class Setup:
    def __init__(self, root: Path, left: tuple[str, ...] = ()) -> None:
        """``left``: scope directories already in the slice when the daemon starts (a daemon
        before it died with their jobs running)."""
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
        backend = SystemdBackend(str(root / "cg"), "hostrun.slice", self.manager)
        self.path = str(root / "shared.sock")
        self.clients: list[Client] = []
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o777)  # the group's 0660 in real life: here any user may connect
        listener.listen(1024)
        self.daemon = Daemon(listener, "hostrun.slice", LIMIT, "staff", backend, self.manager)
        self.thread = threading.Thread(target=self.daemon.serve, kwargs={"handle_signals": False},
                                       daemon=True)
        self.thread.start()

    def client(self) -> Client:
        client = Client(self.path)
        self.clients.append(client)  # closed at teardown (closing twice is harmless)
        return client

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
    s = Setup(tmp_path, getattr(request, "param", ()))
    try:
        yield s
    finally:
        s.close()
    assert not s.thread.is_alive(), "the daemon's loop did not end"


OTHER_CLIENT = textwrap.dedent("""\
    import json, os, socket, sys, time
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    f = s.makefile("rwb")
    def ask(m):
        f.write(json.dumps(m).encode() + b"\\n"); f.flush()
    for line in sys.stdin:
        m = json.loads(line)
        if m.get("op") == "child":  # a child of this process, for a scope
            pid = os.fork()
            if pid == 0:  # as hostrun's job would after its exec: not holding the connection
                os.close(s.fileno()); os.close(1); time.sleep(60); os._exit(0)  # stdout: the test's pipe
            m = {"op": "scope", "pids": [pid], "cap": m["cap"],
                 "unit": "hostrun-shared-%d-%d-1.scope" % (os.getuid(), pid)}
        ask(m)
        print(f.readline().decode().strip(), flush=True)
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

    def close(self) -> None:
        self.proc.kill()
        self.proc.communicate()  # and its pipes closed


def test_one_queue_for_every_user_first_come_first_served(setup: Setup, other_user: OtherUser) -> None:
    """root holds 300M of 400M; the other user's 300M waits and is told who holds the room; a later
    50M waits behind it although it would fit (no user overtakes another); when root's connection
    closes, both are admitted. Identity is the kernel's: the other user's hello says its own uid."""
    first = setup.client()
    first.send({"op": "book", "size": 300 * MiB, "cap": 300 * MiB, "label": "first"})
    assert first.receive() == {"state": "admitted"}
    other = OtherClient(other_user, setup.path)
    try:
        assert other.ask({"op": "hello", "protocol": 1, "uid": 0})["uid"] == other_user.uid
        news = other.ask({"op": "book", "size": 300 * MiB, "cap": 300 * MiB, "label": "second"})
        assert news["state"] == "waiting" and news["ahead"] == 0
        assert news["holders"] == [{"user": "root", "label": "first", "size": 300 * MiB}]
        late = setup.client()
        late.send({"op": "book", "size": 50 * MiB, "cap": 50 * MiB, "label": "late"})
        assert late.receive()["ahead"] == 1
        listing = setup.client().ask({"op": "list"})["bookings"]
        assert [(b["label"], b["state"], b["uid"]) for b in listing] == [
            ("first", "running", 0), ("second", "waiting", other_user.uid), ("late", "waiting", 0)]
        first.close()
        # the next line the other user's connection reads is the daemon's news, ahead of any answer
        assert other.ask({"op": "list"}) == {"state": "admitted"}
        assert late.receive() == {"state": "admitted"}
    finally:
        other.close()
    wait_for(lambda: [b["label"] for b in setup.client().ask({"op": "list"})["bookings"]] == ["late"])


def test_a_scope_holds_only_the_callers_own_children(setup: Setup, other_user: OtherUser) -> None:
    """The other user may not put root's process (a child of this test) in a scope, nor name a unit
    after another uid; its own child is accepted, with the daemon's properties, held to the waiting
    allowance until its booking is admitted, raised to the cap then, and killed when it leaves."""
    mine = subprocess.Popen(["sleep", "60"])
    other = OtherClient(other_user, setup.path)
    try:
        refused = other.ask({"op": "scope", "pids": [mine.pid], "cap": MiB,
                             "unit": f"hostrun-shared-{other_user.uid}-1-1.scope"})
        assert "is not a child of the caller" in refused["error"]
        named = other.ask({"op": "scope", "pids": [mine.pid], "cap": MiB,
                           "unit": "hostrun-shared-0-1-1.scope"})
        assert "unit must be hostrun-shared-" in named["error"]
        assert "StartTransientUnit" not in setup.fake.members()
        started = other.ask({"op": "child", "cap": 200 * MiB})
        assert started["unit"].startswith(f"hostrun-shared-{other_user.uid}-"), started
        (body,) = [b for m, b in setup.fake.calls if m == "StartTransientUnit"]
        props = dict(body[2])
        assert props["Slice"] == ("s", "hostrun.slice") and props["MemoryMax"] == ("t", WAITING_MAX)
        assert props["MemorySwapMax"] == ("t", 0) and props["OOMPolicy"] == ("s", "stop")
        assert other.ask({"op": "book", "size": 100 * MiB, "cap": 200 * MiB, "label": "x"}) == {
            "state": "admitted"}
        raised = [b for m, b in setup.fake.calls if m == "SetUnitProperties"]
        assert raised[-1][0] == started["unit"] and dict(raised[-1][2])["MemoryMax"] == ("t", 200 * MiB)
    finally:
        other.close()
        mine.kill()
        mine.wait()
    wait_for(lambda: ("KillUnit", [started["unit"], "all", 9]) in setup.fake.calls)
    child = int(started["unit"].split("-")[3])  # the fake manager kills nothing: the test does
    os.kill(child, signal.SIGKILL)


def test_bad_requests_get_one_line_and_nothing_is_booked(setup: Setup) -> None:
    c = setup.client()
    too_big = c.ask({"op": "book", "size": LIMIT + 1, "cap": MiB})
    assert "larger than the whole shared slice" in too_big["error"]
    assert "size: a positive number of bytes" in c.ask({"op": "book", "size": "1G", "cap": MiB})["error"]
    assert "unknown request" in c.ask({"op": "unbook", "uid": 0})["error"]
    c.sock.sendall(b"not json\n")
    assert c.receive() == {"error": "not a JSON object"}
    with pytest.raises((EOFError, ConnectionResetError)):
        c.receive()
    assert setup.client().ask({"op": "list"})["bookings"] == []


def _alive(setup: Setup) -> None:
    """The daemon still answers a fresh connection (its loop is alive) and holds no booking."""
    assert setup.thread.is_alive(), "the daemon's loop died"
    assert setup.client().ask({"op": "list"})["bookings"] == []


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
    holder.send({"op": "book", "size": 100 * MiB, "cap": 100 * MiB, "label": "holder"})
    assert holder.receive() == {"state": "admitted"}
    for payload in (b"[" * 100_000 + b"\n", b"[" * 20_000 + b"\n", b'{"op": "' + b"x" * 2_000_000):
        c = setup.client()
        try:
            c.sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it stopped reading at its bound: what it said before is still to be read
        (line,) = _ended(c)
        assert line["error"] in ("not a JSON object", "request too long"), line
        assert setup.thread.is_alive(), f"the daemon died on {payload[:20]!r}"
    (booking,) = setup.client().ask({"op": "list"})["bookings"]
    assert booking["label"] == "holder" and booking["state"] == "running"
    holder.close()
    wait_for(lambda: setup.client().ask({"op": "list"})["bookings"] == [])


def test_out_of_range_numbers_are_refused_with_one_line(setup: Setup) -> None:
    """A pid or grace too large for a C long (before: OverflowError killed the daemon), a pid above
    the kernel's pid range, NaN and infinities, floats and booleans where bytes are asked: each is
    refused on its connection, which stays usable; nothing is booked or started."""
    child = subprocess.Popen(["sleep", "60"])  # a child of this test: the caller's own
    try:
        c = setup.client()
        unit = f"hostrun-shared-0-{child.pid}-1.scope"
        for bad, said in (({"pids": [2 ** 63]}, "pids:"), ({"pids": [2 ** 70]}, "pids:"),
                          ({"pids": [1 << 23]}, "pids:"), ({"pids": [-5]}, "pids:"),
                          ({"grace": 10 ** 400}, "grace:"), ({"grace": -10 ** 400}, "grace:"),
                          ({"grace": "1"}, "grace:"), ({"grace": float("nan")}, "grace:"),
                          ({"grace": float("inf")}, "grace:"), ({"grace": 1e300}, "grace:"),
                          ({"cap": 1.5}, "cap:"), ({"cap": True}, "cap:"),
                          ({"unit": ["x"]}, "unit must be"), ({"unit": "hostrun-shared-0-١٢.scope"},
                                                              "unit must be")):
            request = {"op": "scope", "pids": [child.pid], "cap": MiB, "unit": unit, **bad}
            answer = c.ask(request)
            assert said in answer.get("error", ""), (bad, answer)
            assert setup.thread.is_alive(), f"the daemon died on {bad}"
        for bad in ({"size": 2 ** 64}, {"size": -1}, {"size": 1e9}, {"size": MiB, "cap": 10 ** 300},
                    {"size": MiB, "cap": MiB, "label": ["x"] * 10}):
            answer = c.ask({"op": "book", "cap": MiB, **bad})
            assert "error" in answer or bad.get("label"), (bad, answer)
            if "error" not in answer:  # a label that is not text is dropped, the booking stands
                assert answer == {"state": "admitted"}
        for op in (["x"] * 1000, {"a": 1}, None, 7, "x" * 5000):
            answer = c.ask({"op": op})
            assert "unknown request" in answer["error"] and len(answer["error"]) < 200, answer
        assert "StartTransientUnit" not in setup.fake.members()
        c.close()
    finally:
        child.kill()
        child.wait()
    wait_for(lambda: setup.client().ask({"op": "list"})["bookings"] == [])


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
        read_first = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
                      "print(s.makefile('rb').readline().decode().strip())")
        ninth = other_user.run(["/usr/bin/python3", "-c", read_first, setup.path], timeout=30)
        answer = json.loads(ninth.stdout)
        assert f"uid {other_user.uid} has 8 connections" in answer["error"], answer
        mine = setup.client()
        mine.send({"op": "book", "size": MiB, "cap": MiB, "label": "root's"})
        assert mine.receive() == {"state": "admitted"}
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
    assert other.ask({"op": "hello", "protocol": 1})["protocol"] == 1
    try:
        flooder.sock.sendall(b'{"op":"list"}\n' * 40_000)
    except (BrokenPipeError, ConnectionResetError):
        pass  # dropped before it had sent them all
    lines = _ended(flooder)
    assert len(lines) < 44_000 and all("bookings" in line for line in lines)
    _alive(setup)


@pytest.mark.parametrize("setup", [("hostrun-shared-1000-77-1.scope", "hostrun-shared-0-5-2.scope",
                                    "other.scope")], indirect=True)
def test_a_starting_daemon_ends_the_scopes_no_booking_owns(setup: Setup) -> None:
    """Scopes left in the slice by a daemon that died run unbooked (the new one knows no booking):
    the daemon ends them as it starts, and leaves units that are not hostrun's jobs alone."""
    _alive(setup)
    killed = sorted(b[0] for m, b in setup.fake.calls if m == "KillUnit")
    assert killed == ["hostrun-shared-0-5-2.scope", "hostrun-shared-1000-77-1.scope"]


def test_a_fuzz_from_two_users_leaves_the_booking_held_meanwhile(setup: Setup, other_user: OtherUser,
                                                                  tmp_path: Path) -> None:
    """The VM's fuzz (tests/support/sharedattack.py's script: malformed, oversized, deeply nested
    and out-of-range requests, pipelined floods never read) from root and the other user at once,
    more than 10,000 requests, while a booking is held and others are made and ended: the daemon's
    loop lives, the held booking is as it was, and every later booking is admitted."""
    from tests.support.sharedattack import ATTACK

    holder = setup.client()
    holder.send({"op": "book", "size": 100 * MiB, "cap": 100 * MiB, "label": "held"})
    assert holder.receive() == {"state": "admitted"}
    (before,) = setup.client().ask({"op": "list"})["bookings"]
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
        c.send({"op": "book", "size": MiB, "cap": MiB, "label": "meanwhile"})
        assert c.receive() == {"state": "admitted"}
        c.close()
        booked += 1
    sent = 0
    for f in fuzzers:
        out, _ = f.communicate()
        assert f.returncode == 0 and "malformed" in out, out
        sent += int(out.split("sent")[-1])
    assert sent >= 10_000 and booked
    assert setup.thread.is_alive()
    wait_for(lambda: [b["label"] for b in setup.client().ask({"op": "list"})["bookings"]] == ["held"])
    assert setup.client().ask({"op": "list"})["bookings"] == [before]


def test_an_open_connection_never_reads_as_closed_by_the_daemon(setup: Setup) -> None:
    """At a job's end hostrun peeks at its connection to tell whether the daemon went away. The
    socket still carried the timeout its last ``receive`` left, so Python waited that out and raised
    TimeoutError, read as "closed": a false "the shared-slice daemon went away" warning (seen in the
    VM after an attack). Open, it reads open (a daemon that really went away: the VM's SIGKILL test)."""
    from dispatch.capping.shared import Connection

    conn = Connection(setup.path)
    try:
        assert conn.ask({"op": "hello", "protocol": 1})["protocol"] == 1  # leaves a timeout set
        assert not conn.closed_by_daemon()
        assert conn.ask({"op": "list"}) is not None  # and the connection still works after the peek
    finally:
        conn.close()
