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
    def __init__(self, root: Path) -> None:
        self.root = root
        self.slice = root / "cg" / "hostrun.slice"
        self.slice.mkdir(parents=True)
        for name, text in (("memory.current", "0"), ("memory.max", str(LIMIT)),
                           ("memory.stat", "anon 0\nshmem 0\nfile 0\n")):
            (self.slice / name).write_text(text + "\n")
        self.fake = FakeManager(str(root / "systemd-private"))
        self.manager = Manager(self.fake.path, "", False)
        backend = SystemdBackend(str(root / "cg"), "hostrun.slice", self.manager)
        self.path = str(root / "shared.sock")
        self.clients: list[Client] = []
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o777)  # the group's 0660 in real life: here any user may connect
        listener.listen(16)
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
def setup(tmp_path: Path) -> Iterator[Setup]:
    os.chmod(tmp_path, 0o755)
    for parent in tmp_path.parents:  # the other user must reach the socket
        if parent == Path("/"):
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
    s = Setup(tmp_path)
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
