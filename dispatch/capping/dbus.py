"""A small D-Bus client, standard library only, for the one conversation hostrun has with systemd.

Why not ``systemd-run`` or ``busctl``: a job's scope must hold two processes from the start (the job
and a *keeper*, see ``dispatch.capping.systemd``), which ``systemd-run --scope`` cannot do; and
``busctl`` cannot talk to the manager's private socket (it always says Hello, which a peer-to-peer
socket refuses), while a workstation without ``dbus-user-session`` has no user bus at all. So this
speaks the protocol itself: EXTERNAL authentication, the marshalling of the few types the calls use,
method calls, and the ``JobRemoved`` signal that says a unit's start job has finished.

Addresses: the system manager's private socket ``/run/systemd/private`` (root only), the user
manager's ``$XDG_RUNTIME_DIR/systemd/private``, or a message bus (the system bus, which needs
``Hello`` and polkit's consent for a non-root caller). Everything is little-endian; unix fd passing
and big-endian peers are left out.
"""

from __future__ import annotations

import _socket  # not ``socket``: its enum conversions cost more than this whole conversation
import os
import struct
import time

from dispatch.core.errors import DBusError

MYPY = False
if MYPY:
    from typing import Any

METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4
_PATH, _INTERFACE, _MEMBER, _ERROR_NAME, _REPLY_SERIAL, _DESTINATION, _SENDER, _SIGNATURE = range(1, 9)
_FIELD_TYPES = {_PATH: "o", _INTERFACE: "s", _MEMBER: "s", _ERROR_NAME: "s", _REPLY_SERIAL: "u",
                _DESTINATION: "s", _SENDER: "s", _SIGNATURE: "g", 9: "u"}
_FIXED = {"y": ("B", 1), "b": ("I", 4), "n": ("h", 2), "q": ("H", 2), "i": ("i", 4), "u": ("I", 4),
          "x": ("q", 8), "t": ("Q", 8), "d": ("d", 8), "h": ("I", 4)}
_ALIGN = {"s": 4, "o": 4, "g": 1, "a": 4, "(": 8, "{": 8, "v": 1, **{k: v[1] for k, v in _FIXED.items()}}

SYSTEMD = "org.freedesktop.systemd1"
KEPT_SIGNALS = frozenset({"JobRemoved"})  # the only signal hostrun waits for; others go unread
SYSTEMD_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"


def split_signature(sig: str) -> list[str]:
    """The complete types in a signature: ``"sa(sv)u"`` → ``["s", "a(sv)", "u"]``."""
    types, i = [], 0
    while i < len(sig):
        end = _type_end(sig, i)
        types.append(sig[i:end])
        i = end
    return types


def _type_end(sig: str, i: int) -> int:
    if sig[i] == "a":
        return _type_end(sig, i + 1)
    if sig[i] in "({":
        close, depth, j = ")" if sig[i] == "(" else "}", 0, i
        while j < len(sig):
            if sig[j] in "({":
                depth += 1
            elif sig[j] in ")}":
                depth -= 1
                if depth == 0:
                    if sig[j] != close:
                        break
                    return j + 1
            j += 1
        raise ValueError(f"unbalanced signature {sig!r}")
    if sig[i] in _ALIGN:
        return i + 1
    raise ValueError(f"unsupported type {sig[i]!r} in signature {sig!r}")


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def pad(self, align: int) -> None:
        self.buf += b"\0" * (-len(self.buf) % align)

    def put(self, sig: str, value: Any) -> None:
        code = sig[0]
        if code in _FIXED:
            fmt, size = _FIXED[code]
            self.pad(size)
            self.buf += struct.pack("<" + fmt, value)
        elif code in "so":
            data = str(value).encode()
            self.pad(4)
            self.buf += struct.pack("<I", len(data)) + data + b"\0"
        elif code == "g":
            data = str(value).encode()
            self.buf += bytes([len(data)]) + data + b"\0"
        elif code == "v":
            inner, item = value
            self.put("g", inner)
            self.put(inner, item)
        elif code in "({":
            self.pad(8)
            for part, item in zip(split_signature(sig[1:-1]), value):
                self.put(part, item)
        elif code == "a":
            element = sig[1:]
            self.pad(4)
            at = len(self.buf)
            self.buf += b"\0\0\0\0"
            self.pad(_ALIGN[element[0]])
            start = len(self.buf)
            for item in value:
                self.put(element, item)
            struct.pack_into("<I", self.buf, at, len(self.buf) - start)
        else:
            raise ValueError(f"cannot marshal type {sig!r}")


class _Reader:
    def __init__(self, data: bytes, offset: int = 0) -> None:
        self.data = data
        self.at = offset

    def align(self, align: int) -> None:
        self.at += -self.at % align

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError("message truncated")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def get(self, sig: str) -> Any:
        code = sig[0]
        if code in _FIXED:
            fmt, size = _FIXED[code]
            self.align(size)
            value = struct.unpack("<" + fmt, self.take(size))[0]
            return bool(value) if code == "b" else value
        if code in "so":
            self.align(4)
            (n,) = struct.unpack("<I", self.take(4))
            text = self.take(n + 1)[:-1]
            return text.decode(errors="replace")
        if code == "g":
            n = self.take(1)[0]
            return self.take(n + 1)[:-1].decode()
        if code == "v":
            inner = str(self.get("g"))
            return inner, self.get(inner)
        if code in "({":
            self.align(8)
            return tuple(self.get(part) for part in split_signature(sig[1:-1]))
        if code == "a":
            self.align(4)
            (n,) = struct.unpack("<I", self.take(4))
            self.align(_ALIGN[sig[1]])
            end, items = self.at + n, []
            while self.at < end:
                items.append(self.get(sig[1:]))
            return items
        raise ValueError(f"cannot unmarshal type {sig!r}")


def encode_message(kind: int, serial: int, fields: dict[int, object], signature: str = "",
                   body: tuple[object, ...] = ()) -> bytes:
    """One message: the fixed header, the header fields, padding to 8, the body."""
    payload = _Writer()
    for part, value in zip(split_signature(signature), body):
        payload.put(part, value)
    if signature:
        fields = {**fields, _SIGNATURE: signature}
    head = _Writer()
    head.buf += struct.pack("<cBBBII", b"l", kind, 0, 1, len(payload.buf), serial)
    head.put("a(yv)", [(code, (_FIELD_TYPES[code], value)) for code, value in sorted(fields.items())])
    head.pad(8)
    return bytes(head.buf + payload.buf)


class Message:
    """A message as read: its type, header fields by code, and its body, decoded when first asked
    for (after a Subscribe, systemd sends many signals hostrun only skips)."""

    def __init__(self, kind: int, serial: int, fields: dict[int, object], data: bytes = b"",
                 body_at: int = 0) -> None:
        self.kind = kind
        self.serial = serial
        self.fields = fields
        self._data = data
        self._body_at = body_at
        self._body: list[object] | None = None

    @property
    def body(self) -> list[object]:
        if self._body is None:
            reader = _Reader(self._data, self._body_at)
            signature = str(self.fields.get(_SIGNATURE, ""))
            self._body = [reader.get(part) for part in split_signature(signature)]
        return self._body

    @property
    def member(self) -> str:
        return str(self.fields.get(_MEMBER, ""))

    @property
    def reply_to(self) -> int:
        serial: Any = self.fields.get(_REPLY_SERIAL, 0)
        return int(serial)

    @property
    def error_name(self) -> str:
        return str(self.fields.get(_ERROR_NAME, ""))


def message_size(head: bytes) -> int:
    """The whole message's length from its first 16 bytes."""
    if head[:1] != b"l":
        raise ValueError("only little-endian messages are supported")
    body_len, _, fields_len = struct.unpack("<III", head[4:16])
    return int(16 + fields_len + (-(16 + fields_len) % 8) + body_len)


def decode_message(data: bytes) -> Message:
    kind, _, _, _body_len, serial = struct.unpack("<BBBII", data[1:12])
    reader = _Reader(data, 12)
    fields = {int(code): value[1] for code, value in reader.get("a(yv)")}
    reader.align(8)
    return Message(kind, serial, fields, data, reader.at)


class Connection:
    """One authenticated connection; every call waits at most ``timeout`` seconds for its reply."""

    def __init__(self, path: str, bus: bool = False, timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self._serial = 0
        self._inbox = b""
        self.signals: list[Message] = []
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
            self._authenticate()
            if bus:
                self.call("/org/freedesktop/DBus", "org.freedesktop.DBus", "Hello",
                          destination="org.freedesktop.DBus")
        except OSError as exc:
            self.close()
            raise DBusError(f"cannot talk to {path}: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise

    def _authenticate(self) -> None:
        """AUTH and BEGIN in one write, as sd-bus's own clients (systemctl) send them. Sending BEGIN
        only after the server's OK has arrived can hang: the server may still count its OK as
        unwritten when BEGIN comes in, set BEGIN aside, and not look at it again (systemd PR 24875),
        which was seen here on systemd 252 about once in ten connections."""
        uid = str(os.geteuid()).encode().hex().encode()
        self.sock.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\nBEGIN\r\n")
        line = self._line()
        if not line.startswith(b"OK "):
            raise DBusError(f"{self.path} refused authentication: {line.decode(errors='replace')}")

    def _line(self) -> bytes:
        while b"\r\n" not in self._inbox:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise DBusError(f"{self.path} closed the connection while authenticating")
            self._inbox += chunk
        line, _, self._inbox = self._inbox.partition(b"\r\n")
        return line

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_message(self, deadline: float, budget: float) -> Message:
        """The next message, or DBusError once ``deadline`` passes (``budget``: its length, said)."""
        while True:
            if len(self._inbox) >= 16:
                size = message_size(self._inbox[:16])
                if len(self._inbox) >= size:
                    data, self._inbox = self._inbox[:size], self._inbox[size:]
                    return decode_message(data)
            left = deadline - time.monotonic()
            if left <= 0:
                raise DBusError(f"no answer from {self.path} within {budget:g} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except _socket.timeout:
                continue
            except OSError as exc:
                raise DBusError(f"lost the connection to {self.path}: {exc.strerror or exc}") from None
            if not chunk:
                raise DBusError(f"{self.path} closed the connection")
            self._inbox += chunk

    def call(self, path: str, interface: str, member: str, signature: str = "",
             body: tuple[object, ...] = (), destination: str = SYSTEMD) -> list[object]:
        """Call a method and return its reply's body; an error reply raises ``DBusError``. Signals
        that arrive meanwhile are kept in ``signals``."""
        self._serial += 1
        serial = self._serial
        fields: dict[int, object] = {_PATH: path, _INTERFACE: interface, _MEMBER: member,
                                     _DESTINATION: destination}
        try:
            self.sock.sendall(encode_message(METHOD_CALL, serial, fields, signature, body))
        except OSError as exc:
            raise DBusError(f"cannot talk to {self.path}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._read_message(deadline, self.timeout)
            if msg.kind == SIGNAL:
                if msg.member in KEPT_SIGNALS:  # a job may end before its start call's reply
                    self.signals.append(msg)
            elif msg.kind in (METHOD_RETURN, ERROR) and msg.reply_to == serial:
                if msg.kind == ERROR:
                    text = str(msg.body[0]) if msg.body else msg.error_name
                    raise DBusError(text, msg.error_name)
                return msg.body

    def wait_signal(self, member: str, match: object, timeout: float | None = None) -> Message:
        """The first signal named ``member`` whose first body value after the first is ``match``
        (``JobRemoved``'s job path), kept from earlier calls or read now."""
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        while True:
            for msg in self.signals:
                if msg.member == member and len(msg.body) > 1 and msg.body[1] == match:
                    self.signals.remove(msg)
                    return msg
            msg = self._read_message(deadline, budget)
            if msg.kind == SIGNAL and msg.member == member:  # others are skipped, never decoded
                self.signals.append(msg)

    def manager(self, member: str, signature: str = "", *body: object) -> list[object]:
        return self.call(SYSTEMD_PATH, MANAGER, member, signature, body)

    def manager_property(self, name: str) -> object:
        (value,) = self.call(SYSTEMD_PATH, "org.freedesktop.DBus.Properties", "Get", "ss",
                             (MANAGER, name))
        return value[1]  # type: ignore[index]
