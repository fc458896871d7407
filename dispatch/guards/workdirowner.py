"""A work directory's claim: its owner file, ``DIR/.hostrun-owner``, written, read and trusted.

The file is JSON (session, created, purpose, host, user, pid, and the directory's device and inode;
mode 0644, since every session's ``hostrun workdir list`` reads it). This module is the format's one
home: ``claim`` writes it, ``read_owner`` reads it for a listing, ``read_owner_at`` reads it through a
directory's descriptor and says whether it may be trusted for a removal. Finding, listing and cleaning
claimed directories is ``dispatch.guards.workdirs``, which re-exports these names.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Mapping

from dispatch.core.atomicfile import write_atomic
from dispatch.core.errors import NotRunError, UsageError
from dispatch.core.procinfo import start_time
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Any

OWNER_FILE = ".hostrun-owner"


class Owner(NamedTuple):
    session: str
    created: float
    purpose: str
    host: str = ""
    user: str = ""
    pid: int = 0  # the claiming process's parent (the shell or agent that asked); informational
    # The claimed directory's device and inode: an owner file proves it belongs to the directory it
    # sits in (one moved elsewhere, by whoever can write both places, claims nothing there).
    dir_dev: int = 0
    dir_ino: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.created))
        return data


def explicit_session(session: str | None = None, environ: Mapping[str, str] | None = None
                     ) -> str | None:
    env = os.environ if environ is None else environ
    return session or env.get("HOSTRUN_SESSION") or None


def fallback_session() -> str:
    """This process's POSIX session, made unique over time by its leader's start time."""
    sid = os.getsid(0)
    return f"sid-{sid}-{start_time(sid) or 0}"


def owner_path(directory: str) -> str:
    return os.path.join(directory, OWNER_FILE)


def read_owner(directory: str) -> Owner | None:
    """The owner, or None when unclaimed. An owner file that cannot be read or parsed still claims
    the directory, for an unknown session (``session`` empty): nobody's ``clean`` removes it."""
    path = owner_path(directory)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        with open(path, "rb") as fh:
            return _parse_owner(fh.read(), st)
    except OSError as exc:
        return Owner(session="", created=st.st_mtime, purpose=f"(unreadable owner file: {exc})")


def _parse_owner(raw: bytes, st: os.stat_result) -> Owner:
    try:
        data = json.loads(raw.decode("utf-8"))
        return Owner(session=str(data["session"]), created=float(data["created"]),
                     purpose=str(data.get("purpose", "")), host=str(data.get("host", "")),
                     user=str(data.get("user", "")), pid=int(data.get("pid", 0)),
                     dir_dev=int(data.get("dir_dev", 0)), dir_ino=int(data.get("dir_ino", 0)))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return Owner(session="", created=st.st_mtime, purpose=f"(unreadable owner file: {exc})")


def read_owner_at(dir_fd: int) -> tuple[Owner | None, str | None]:
    """The owner of the directory open as ``dir_fd`` (read through it, the link never followed),
    and why the owner file is not to be trusted (None when it is).

    Trusted: a regular file owned by the caller or root, not writable by group or others, with no
    other hard link. Anyone else's owner file may name any session, so it never lets ``clean``
    remove anything.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(OWNER_FILE, flags, dir_fd=dir_fd)
    except OSError:  # missing, or a link: not a claim (as read_owner)
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, None
        raw = b""
        while len(raw) <= 1 << 20:  # an owner file is a few hundred bytes
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            raw += chunk
    except OSError as exc:
        return Owner(session="", created=0.0, purpose=f"(unreadable owner file: {exc})"), None
    finally:
        os.close(fd)
    owner = _parse_owner(raw, st)
    if st.st_uid not in (0, os.geteuid()):
        return owner, f"is owned by uid {st.st_uid}, not by you or root"
    if st.st_mode & 0o022:
        return owner, "is writable by others"
    if st.st_nlink != 1:
        return owner, "has other hard links"
    here = os.fstat(dir_fd)
    if (owner.dir_dev, owner.dir_ino) != (here.st_dev, here.st_ino):
        return owner, ("was written for another directory (moved here?), or by an older hostrun: "
                       "claim the directory again to record it")
    return owner, None


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def claim(directory: str, purpose: str, session: str) -> tuple[str, Owner, bool]:
    """Claim DIR (created if missing) for ``session``: (real path, owner, whether newly claimed).

    Claiming your own directory again updates its purpose and keeps its creation time; a directory
    another session owns is refused (``NotRunError``, exit 78) and left as it is.
    """
    if not session:
        raise UsageError("a claim needs a session name")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {directory}: {exc.strerror}") from None
    real = os.path.realpath(directory)
    if not os.path.isdir(real):
        raise UsageError(f"{directory}: not a directory")
    existing = read_owner(real)
    if existing is not None and existing.session != session:
        raise NotRunError(f"{real} is already claimed by session {existing.session or '(unknown)'} "
                          f"({existing.purpose}; since {claimed_when(existing.created)}); not claimed")
    here = os.stat(real)
    owner = Owner(session=session, created=existing.created if existing else time.time(),
                  purpose=purpose, host=socket.gethostname(), user=_user(), pid=os.getppid(),
                  dir_dev=here.st_dev, dir_ino=here.st_ino)
    _write_owner(real, owner)
    return real, owner, existing is None


def claim_if_unclaimed(directory: str, purpose: str, session: str) -> dict[str, Any]:
    """For the agent's ``probe``: claim a peer work directory for the controller's session unless
    someone already has. Never raises: the answer says who owns it, or why it could not be claimed."""
    try:
        existing = read_owner(directory)
        if existing is not None:
            return {"session": existing.session, "claimed_now": False}
        _, owner, _ = claim(directory, purpose, session)
        return {"session": owner.session, "claimed_now": True}
    except (OSError, UsageError, NotRunError) as exc:
        return {"error": str(exc)}


def _write_owner(directory: str, owner: Owner) -> None:
    data = owner._asdict()
    data["created_at"] = owner.as_dict()["created_at"]
    path = owner_path(directory)
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), 0o644,
                 exact_mode=True)


def claimed_when(epoch: float) -> str:
    """A claim's time as the refusals and ``clean``'s reasons print it."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))
