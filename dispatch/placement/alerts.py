"""Alerts for the main session: reading the alert file, per-session read cursors, following it.

Writers (the runner's own-cap and slice-full verdicts and long waits, the peer watch, a ``--peer`` run
that could not start or ended at a cap on the peer) append one JSON line each through
``dispatch.local.alertlog``. hostrun never moves a job itself: each alert says what happened and the
``action`` it suggests, and the main session (or a person) decides.

An alert is addressed to the session of the job it is about (``session``; None: every session). Each
session has a read cursor, a small private file under ``<state_dir>/alert-cursors/``, holding where in
the alert file it has read to; ``unread`` returns that session's alerts after it and moves it on, under
an exclusive ``flock``, so two readers of one session never both get the same alert. A cursor notes the
file's inode: a replaced (rotated) or truncated file is read again from its start. A session's first
read sees every alert addressed to it by name, but alerts addressed to every session only from the
moment its cursor was made (a new session is not handed the whole file's history).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

from dispatch.core.jsontext import loads
from dispatch.local.alertlog import FIELDS as FIELDS
from dispatch.local.alertlog import KINDS as KINDS
from dispatch.local.alertlog import OWN_CAP as OWN_CAP
from dispatch.local.alertlog import PEER_COULD_TAKE as PEER_COULD_TAKE
from dispatch.local.alertlog import PEER_UNREACHABLE as PEER_UNREACHABLE
from dispatch.local.alertlog import SLICE_FULL as SLICE_FULL
from dispatch.local.alertlog import WAITING as WAITING
from dispatch.local.alertlog import append as append
from dispatch.local.alertlog import record as record
from dispatch.local.alertlog import write as write

MYPY = False
if MYPY:

    from dispatch.core.alertshape import Alert
    from dispatch.core.settings import Settings

CURSOR_DIR = "alert-cursors"


def parse_lines(data: bytes) -> list[Alert]:
    """The records in ``data`` (complete lines); a line that is not a JSON object is skipped."""
    records: list[Alert] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            item = loads(line.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is one too
            continue
        if isinstance(item, dict):  # read as an Alert: every field through .get, each type checked
            records.append(item)  # type: ignore[arg-type]
    return records


def read_all(path: str) -> list[Alert]:
    try:
        with open(path, "rb") as fh:
            return parse_lines(fh.read())
    except FileNotFoundError:
        return []


def end_of(path: str) -> int:
    """Where ``follow`` should start to see only what is appended from now on."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def follow(path: str, poll: float = 0.2, from_start: bool = False,
           stop: Callable[[], bool] | None = None, offset: int | None = None
           ) -> Iterator[Alert]:
    """Yield alerts as they are appended, until ``stop()`` (forever without one). Starts at the end
    as it is when first read (at ``offset`` if given, at 0 with ``from_start``). Survives rotation: a
    file replaced under the same name (another inode) is read from its start once the old one is
    drained; a truncated file (now shorter than what was read) is read again from its start."""
    fh = None
    partial = b""
    first = True
    try:
        while stop is None or not stop():
            if fh is None:
                try:
                    fh = open(path, "rb")
                except FileNotFoundError:
                    first = False  # it appears later: all of it is new
                    time.sleep(poll)
                    continue
                if first and offset is not None:
                    fh.seek(offset)
                elif first and not from_start:
                    fh.seek(0, os.SEEK_END)
                first = False
            if os.fstat(fh.fileno()).st_size < fh.tell():
                fh.seek(0)  # truncated in place
                partial = b""
            data = fh.read()
            if data:
                partial += data
                *lines, partial = partial.split(b"\n")
                yield from parse_lines(b"\n".join(lines))
                continue
            try:
                now = os.stat(path)
                replaced = (now.st_ino, now.st_dev) != (os.fstat(fh.fileno()).st_ino,
                                                        os.fstat(fh.fileno()).st_dev)
            except FileNotFoundError:
                replaced = True
            if replaced:  # the old file is drained: go on with the new one, from its start
                fh.close()
                fh, partial = None, b""
                continue
            time.sleep(poll)
    finally:
        if fh is not None:
            fh.close()


def addressed_to(item: Alert, session: str | None) -> bool:
    """An alert without a session is for every session; with one, for that session only."""
    target = item.get("session")
    return target is None or session is None or target == session


def cursor_path(settings: Settings, session: str) -> str:
    """The cursor file of ``session`` (a ``check_name``-valid name, so no control characters): the name
    quoted to one path component, or its hash when that would be too long."""
    from dispatch.core.text import check_name

    check_name(session, "--session")
    name = "s-" + _quote(session)
    if len(name) > 200:
        import hashlib

        name = "h-" + hashlib.sha256(session.encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(settings.state_dir, CURSOR_DIR, name)


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _quote(text: str) -> str:
    """``urllib.parse.quote(text, safe="")``, without importing ``urllib.parse`` (and ``ipaddress``)
    on the PostToolUse hook's path, which runs after every tool call."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in text.encode("utf-8", "surrogateescape"))


def _open_cursor(path: str) -> int:
    """The cursor file, created 0600 in a private directory and checked: ours, a regular file that
    nobody else can read or write (never a symlink)."""
    from dispatch.core.errors import UntrustedPathError
    from dispatch.guards.trust import private_dir

    private_dir(os.path.dirname(path))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    import stat

    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise UntrustedPathError(f"refusing the alert cursor {path}: not a private file of yours "
                                 f"(mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}); remove it")
    return fd


def _cursor_text(ident: object, offset: int, since: float) -> bytes:
    """The cursor as JSON, numbers only (written by hand: ``json``'s encoder loads ``re``, ~10 ms on
    the hooks' path after every tool call; bench/bench_hook.py). ``ident``: the alert file's
    [device, inode], else null."""
    known = isinstance(ident, list) and len(ident) == 2 and all(type(v) is int for v in ident)
    file = f"[{ident[0]}, {ident[1]}]" if known else "null"  # type: ignore[index]
    return f'{{"file": {file}, "offset": {int(offset)}, "since": {float(since)!r}}}'.encode()


def unread(settings: Settings, session: str, mark: bool = True) -> list[Alert]:
    """The alerts for ``session`` that it has not read yet, oldest first; with ``mark`` its cursor
    moves past them (and past every alert for other sessions), so each is returned once."""
    from dispatch.core.flocking import flock_wait

    fd = _open_cursor(cursor_path(settings, session))
    try:
        flock_wait(fd)
        raw = os.pread(fd, 4096, 0)
        try:
            state = loads(raw.decode("utf-8")) if raw.strip() else {}
        except ValueError:
            state = {}
        if not isinstance(state, dict):
            state = {}
        since = state.get("since")
        if not isinstance(since, (int, float)):
            since = time.time()
        stored = state.get("offset")
        offset = stored if isinstance(stored, int) and stored >= 0 else 0
        found: list[Alert] = []
        try:
            fh = open(settings.alerts_path, "rb")
        except FileNotFoundError:
            fh = None
        ident = state.get("file")
        if fh is not None:
            with fh:
                st = os.fstat(fh.fileno())
                if [st.st_dev, st.st_ino] != ident or st.st_size < offset:
                    offset = 0  # rotated, replaced or truncated: the new file from its start
                ident = [st.st_dev, st.st_ino]
                fh.seek(offset)
                data = fh.read()
                end = data.rfind(b"\n") + 1  # a line still being written is read next time
                for item in parse_lines(data[:end]):
                    if item.get("session") == session or (
                            item.get("session") is None and float(item.get("time") or 0) >= since):
                        found.append(item)
                offset += end
        if mark or not raw.strip():
            text = _cursor_text(ident, offset if mark else 0, since)
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
        return found
    finally:
        os.close(fd)


def when(item: Alert) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(item.get("time") or 0)))
    except (TypeError, ValueError, OverflowError):
        return "????-??-?? ??:??:??"


def describe(item: Alert) -> str:
    """One line for people and agents: when, what, about which job, and the suggested action;
    escaped (``printable``), since an alert quotes labels, sessions and commands of other users."""
    from dispatch.core.text import printable

    kind = str(item.get("kind") or "?")
    message = str(item.get("message") or "")
    action = item.get("action")
    session = item.get("session")
    line = f"{when(item)} {kind}"
    if session:
        line += f" [session {session}]"
    line += f": {message}" if message else f": job {item.get('label', '?')} on {item.get('host', '?')}"
    if action and str(action) not in message:
        line += f" (suggested: {action})"
    return printable(line)
