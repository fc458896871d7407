"""A FAKE systemd manager on a Unix socket, for fast tests of hostrun's D-Bus conversation.

What it is: a thread that accepts connections on a socket path, does the EXTERNAL handshake the way
sd-bus does (AUTH may come with BEGIN in the same write; it answers OK), then answers the manager
methods hostrun calls (Subscribe, Get, SetUnitProperties, StartUnit, StartTransientUnit) and sends
``JobRemoved`` for each start job, with noise signals around it as a real manager does. It records
every call with its decoded body, and can be told to answer a method with an error, to send the
job's end before its reply, to end a start job as "failed", or never to answer.

What it is not: systemd. It moves no process and makes no cgroup; it decodes with hostrun's own
codec, so it cannot catch a wire-format mistake both sides share. The real conversation (a real
systemd 252, system and user managers) is tested in the VM (tests/vm/test_vm_systemd.py).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from dispatch.capping.dbus import (
    ERROR,
    METHOD_RETURN,
    SIGNAL,
    decode_message,
    encode_message,
    message_size,
)

_PATH, _INTERFACE, _MEMBER, _ERROR_NAME, _REPLY_SERIAL, _DESTINATION = 1, 2, 3, 4, 5, 6


class FakeManager:
    def __init__(self, path: str) -> None:
        self.path = path
        self.calls: list[tuple[str, list[Any]]] = []
        self.errors: dict[str, tuple[str, str]] = {}  # member -> (error name, message)
        self.silent: set[str] = set()  # members never answered
        self.job_result = "done"
        self.job_removed_first = False
        self.refuse_auth = False
        self._jobs = 0
        self._serial = 1000
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(8)
        self._stop = False
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    def close(self) -> None:
        self._stop = True
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as poke:
                poke.connect(self.path)
        except OSError:
            pass
        self._server.close()
        os.unlink(self.path)

    def members(self) -> list[str]:
        return [member for member, _ in self.calls]

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if self._stop:
                conn.close()
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _send(self, conn: socket.socket, kind: int, fields: dict[int, object], signature: str = "",
              body: tuple[object, ...] = ()) -> None:
        self._serial += 1
        conn.sendall(encode_message(kind, self._serial, fields, signature, body))

    def _signal(self, conn: socket.socket, member: str, signature: str, body: tuple[object, ...]) -> None:
        self._send(conn, SIGNAL, {_PATH: "/org/freedesktop/systemd1",
                                  _INTERFACE: "org.freedesktop.systemd1.Manager", _MEMBER: member},
                   signature, body)

    def _serve(self, conn: socket.socket) -> None:
        """One client's connection, until it closes. A client that goes away while an answer or a
        signal is on its way (a job's keeper, a test's connection) ends it quietly, as for systemd."""
        try:
            self._serve_one(conn)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            answered = False
            while b"BEGIN\r\n" not in data:  # sd-bus style: AUTH and BEGIN may come together
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
                if not answered and b"\r\n" in data:
                    answered = True
                    if self.refuse_auth or not data.startswith(b"\0AUTH EXTERNAL "):
                        conn.sendall(b"REJECTED EXTERNAL\r\n")
                        return
                    conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
            inbox = data.split(b"BEGIN\r\n", 1)[1]
            while True:
                while len(inbox) < 16 or len(inbox) < message_size(inbox[:16]):
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    inbox += chunk
                size = message_size(inbox[:16])
                msg, inbox = decode_message(inbox[:size]), inbox[size:]
                self._answer(conn, msg)

    def _answer(self, conn: socket.socket, msg: Any) -> None:
        member = msg.member
        self.calls.append((member, msg.body))
        if member in self.silent:
            return
        reply = {_REPLY_SERIAL: msg.serial}
        self._signal(conn, "UnitNew", "so", ("noise.service", "/org/freedesktop/systemd1/unit/noise"))
        if member in self.errors:
            name, text = self.errors[member]
            self._send(conn, ERROR, {**reply, _ERROR_NAME: name}, "s", (text,))
            return
        if member == "Get":
            self._send(conn, METHOD_RETURN, reply, "v", (("s", "/fake"),))
        elif member in ("StartUnit", "StartTransientUnit"):
            self._jobs += 1
            job = f"/org/freedesktop/systemd1/job/{self._jobs}"
            removed = (self._jobs, job, str(msg.body[0]), self.job_result)
            if self.job_removed_first:
                self._signal(conn, "JobRemoved", "uoss", removed)
            self._send(conn, METHOD_RETURN, reply, "o", (job,))
            self._signal(conn, "PropertiesChanged", "sa{sv}as",
                         ("org.freedesktop.systemd1.Unit", [("ActiveState", ("s", "active"))], []))
            if not self.job_removed_first:
                self._signal(conn, "JobRemoved", "uoss", (self._jobs - 1, job + "0", "other.unit", "done"))
                self._signal(conn, "JobRemoved", "uoss", removed)
        else:
            self._send(conn, METHOD_RETURN, reply)
