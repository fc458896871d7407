"""Work-directory ownership: ``hostrun workdir claim|list|clean``.

``claim DIR --purpose TEXT`` writes an owner file, ``DIR/.hostrun-owner`` (JSON: session, created,
purpose, host, user, pid; mode 0644, since every session's ``list`` reads it); the file, its format
and its trust rule live in ``dispatch.guards.workdirowner``, whose names are importable from here too.
``list`` finds the claimed directories under a root (the root, its children and grandchildren; a
claimed directory's own subdirectories belong to it and are not searched), with owner, age, size and
the processes that have something open in it. ``clean`` removes only directories that the calling
session owns and that no process has open; it says why it kept each of the others and never removes
a directory of another session, an unclaimed one, one with another session's claim inside, or one
with a mount point inside. Its checks and the removal go through one descriptor of each directory
(``dispatch.guards.fdtree``), and only an owner file of the caller or root, writable by nobody else,
counts: ``clean`` may run as root in a tree another user can change while it works.

Sessions: ``--session``, else ``$HOSTRUN_SESSION``. ``claim`` without either records this process's
POSIX session (``sid-<SID>-<start time of its leader>``: the same for every command typed in one
terminal, different after the terminal closes). ``clean`` never guesses: two programs started from one
terminal share that id, so it needs ``--session`` or ``$HOSTRUN_SESSION`` to know who is asking.

Open detection reads ``/proc/*/cwd``, ``root``, ``exe`` and ``fd/*``. Root sees every user's processes;
another user sees only their own. Processes that could not be read are counted as
``hidden_processes``.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time

from dispatch.core.errors import UsageError
from dispatch.core.records import NamedTuple
from dispatch.guards.workdirowner import OWNER_FILE as OWNER_FILE
from dispatch.guards.workdirowner import Owner as Owner
from dispatch.guards.workdirowner import claim as claim
from dispatch.guards.workdirowner import claim_if_unclaimed as claim_if_unclaimed
from dispatch.guards.workdirowner import claimed_when
from dispatch.guards.workdirowner import explicit_session as explicit_session
from dispatch.guards.workdirowner import fallback_session as fallback_session
from dispatch.guards.workdirowner import owner_path as owner_path
from dispatch.guards.workdirowner import read_owner as read_owner
from dispatch.guards.workdirowner import read_owner_at as read_owner_at

MYPY = False
if MYPY:
    from typing import Any

DEFAULT_DEPTH = 2
SIZE_BUDGET = 5.0  # seconds ``list`` may spend summing sizes, all directories together
MAX_SHOWN_OPENERS = 5


class Opener(NamedTuple):
    """A process with something open in a directory: ``how`` is cwd, root, exe or ``fd N``."""

    pid: int
    comm: str
    how: str
    path: str

    def text(self) -> str:
        return f"pid {self.pid} ({self.comm}) {self.how}"


class Claimed(NamedTuple):
    path: str
    owner: Owner
    size: int
    size_complete: bool
    openers: list[Opener]

    def as_dict(self, now: float, session: str | None) -> dict[str, Any]:
        return {
            "path": self.path, **self.owner.as_dict(), "age_s": round(max(0.0, now - self.owner.created), 1),
            "mine": session is not None and self.owner.session == session,
            "size_bytes": self.size, "size_complete": self.size_complete, "open": bool(self.openers),
            "open_by": [o._asdict() for o in self.openers],
        }


class CleanAction(NamedTuple):
    """What ``clean`` did with one claimed directory: removed, would-remove (dry run) or kept."""

    path: str
    owner: Owner
    action: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "action": self.action, "reason": self.reason,
                "owner": self.owner.as_dict()}


def find_claimed(root: str, depth: int = DEFAULT_DEPTH) -> tuple[list[str], list[str]]:
    """(claimed directories, unclaimed ones with no claim below) within ``depth`` levels of root.

    Symbolic links are not followed; a claimed directory is not searched further.
    """
    claimed: list[str] = []

    def visit(path: str, level: int) -> list[str]:
        """The unclaimed directories at and below ``path`` (just ``path`` when nothing below it is
        claimed); appends the claimed ones to ``claimed``."""
        if read_owner(path) is not None:
            claimed.append(path)
            return []
        before = len(claimed)
        below: list[str] = []
        if level < depth:
            try:
                with os.scandir(path) as it:
                    children = sorted(e.path for e in it if e.is_dir(follow_symlinks=False))
            except OSError:
                children = []
            for child in children:
                below += visit(child, level + 1)
        return below if len(claimed) > before or level == 0 else [path]

    real = os.path.realpath(root)
    if not os.path.isdir(real):
        raise UsageError(f"{root}: not a directory")
    unclaimed = visit(real, 0)
    return claimed, sorted(unclaimed)


def _inside(target: str, wanted: set[str]) -> str | None:
    """The directory in ``wanted`` that contains ``target`` (or is it), if any."""
    path = target
    while True:
        if path in wanted:
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def openers(directories: list[str], exclude: tuple[int, ...] = ()) -> tuple[dict[str, list[Opener]], int]:
    """For each directory, the processes with their cwd, root, executable or an open file inside it,
    and how many processes could not be inspected (another user's, unless we are root)."""
    wanted = set(directories)
    found: dict[str, list[Opener]] = {d: [] for d in directories}
    hidden = 0
    if not wanted:
        return found, 0
    skip = {os.getpid(), *exclude}
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return found, 0
    for pid in pids:
        if pid in skip:
            continue
        base = f"/proc/{pid}"
        links: list[tuple[str, str]] = []
        denied = False
        for name in ("cwd", "root", "exe"):
            try:
                links.append((name, os.readlink(f"{base}/{name}")))
            except PermissionError:
                denied = True
            except OSError:
                pass
        try:
            fds = os.listdir(f"{base}/fd")
        except PermissionError:
            denied, fds = True, []
        except OSError:
            fds = []
        for fd in fds:
            try:
                links.append((f"fd {fd}", os.readlink(f"{base}/fd/{fd}")))
            except OSError:
                pass
        hidden += denied
        comm = None
        for how, target in links:
            if not target.startswith("/"):
                continue  # pipe:[…], socket:[…], anon_inode:…
            if target.endswith(" (deleted)"):
                target = target[: -len(" (deleted)")]
            if how == "root" and target == "/":
                continue
            owner = _inside(target, wanted)
            if owner is None:
                continue
            if comm is None:
                try:
                    with open(f"{base}/comm", encoding="utf-8", errors="replace") as fh:
                        comm = fh.read().strip()
                except OSError:
                    comm = "?"
            if not any(o.pid == pid for o in found[owner]):  # one line per process is enough
                found[owner].append(Opener(pid, comm, how, target))
    return found, hidden


def tree_size(path: str, deadline: float) -> tuple[int, bool]:
    """Disk usage like ``du -s`` (allocated blocks, hard links once): (bytes, complete before the
    deadline)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [path]
    while stack:
        if time.monotonic() > deadline:
            return total, False
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        key = (st.st_dev, st.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total, True


def list_claimed(root: str, depth: int = DEFAULT_DEPTH, size_budget: float = SIZE_BUDGET,
                 session: str | None = None) -> dict[str, Any]:
    """``hostrun workdir list``: every claimed directory under root, as a JSON-ready dict."""
    paths, unclaimed = find_claimed(root, depth)
    opened, hidden = openers(paths)
    deadline = time.monotonic() + size_budget
    now = time.time()
    rows = []
    for path in paths:
        owner = read_owner(path)
        if owner is None:  # released meanwhile
            continue
        size, complete = tree_size(path, deadline)
        rows.append(Claimed(path, owner, size, complete, opened[path]).as_dict(now, session))
    return {"root": os.path.realpath(root), "depth": depth, "session": session, "directories": rows,
            "unclaimed": unclaimed, "hidden_processes": hidden}


def _blocker_inside(dir_fd: int, path: str, session: str) -> str | None:
    """Why the tree open as ``dir_fd`` (at ``path``) must not be removed although its top is ours:
    another session's claim inside it (or an untrusted one, whatever it names), or a mount point."""
    top = os.fstat(dir_fd).st_dev
    for current, dirs, files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        where = os.path.normpath(os.path.join(path, current))
        if current != "." and OWNER_FILE in files:
            inner, untrusted = read_owner_at(fd)
            if inner is not None and (inner.session != session or untrusted):
                return f"it contains {where}, claimed by session {inner.session or '(unknown)'}"
        for name in dirs:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_dev != top:
                return f"it contains a mount point, {os.path.join(where, name)}"
    return None


def _remove_tree(parent_fd: int, dir_fd: int, name: str) -> None:
    """Remove everything but the owner file, then the owner file, then the directory, all through
    the descriptors opened for the checks: a removal that fails half way leaves the directory still
    claimed, so a later ``clean`` tries again."""
    from dispatch.guards import fdtree

    fdtree.remove_contents(dir_fd, keep=OWNER_FILE)
    os.unlink(OWNER_FILE, dir_fd=dir_fd)
    if not os.path.samestat(os.fstat(dir_fd), os.stat(name, dir_fd=parent_fd, follow_symlinks=False)):
        raise OSError(errno.EBUSY, "it was moved away while being removed (its contents are gone)")
    os.rmdir(name, dir_fd=parent_fd)


def clean(root: str, session: str, depth: int = DEFAULT_DEPTH, dry_run: bool = False
          ) -> dict[str, Any]:
    """``hostrun workdir clean``: remove the caller's own claimed directories that no process has
    open; keep (and say why) every other one."""
    if not session:
        raise UsageError("workdir clean needs to know which session is asking: set HOSTRUN_SESSION "
                         "or pass --session NAME")
    paths, unclaimed = find_claimed(root, depth)
    opened, hidden = openers(paths)
    verdicts: list[CleanAction] = []
    for path in paths:
        owner = read_owner(path)
        if owner is None:
            continue
        verdict = _clean_one(path, owner, session, opened[path], dry_run)
        if verdict is not None:
            verdicts.append(verdict)
    return {"root": os.path.realpath(root), "session": session, "dry_run": dry_run,
            "directories": [v.as_dict() for v in verdicts], "unclaimed": unclaimed,
            "hidden_processes": hidden}


def _clean_one(path: str, seen: Owner, session: str, opened: list[Opener], dry_run: bool
               ) -> CleanAction | None:
    """What ``clean`` does with one claimed directory (None: its claim was released meanwhile).

    Everything that decides the removal, and the removal itself, goes through one descriptor of the
    directory, opened with no symbolic link followed on the way (``dispatch.guards.fdtree``): another user
    who swaps it, or a directory above it, for a link makes the open fail, or leaves us holding
    the directory that was checked.
    """
    from dispatch.guards import fdtree

    try:
        parent_fd, dir_fd = fdtree.open_dir(path)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return CleanAction(path, seen, "kept", "it, or a directory above it, is now a symbolic link "
                                               "or not a directory")
        return CleanAction(path, seen, "kept", f"cannot open it: {exc.strerror or exc}")
    mine = f"owned by this session ({session}) and not open"
    try:
        parent, here = os.fstat(parent_fd), os.fstat(dir_fd)
        if parent.st_mode & stat.S_IWOTH and here.st_uid not in (os.geteuid(),):
            # Anyone can add entries beside it, and someone else owns it: whatever its owner file
            # says, that user could have arranged what is in it and around it. Theirs to remove.
            return CleanAction(path, seen, "kept", f"it belongs to uid {here.st_uid}, not you, and "
                                               f"{os.path.dirname(path)} is writable by anyone")
        owner, reason = _keep_reason_at(dir_fd, path, session, opened)
        if owner is None:  # released meanwhile
            return None
        if reason is not None:
            return CleanAction(path, owner, "kept", reason)
        if dry_run:
            return CleanAction(path, owner, "would-remove", mine)
        # Look again right before removing: the owner file and the processes, for this one.
        owner, reason = _keep_reason_at(dir_fd, path, session, openers([path])[0][path])
        if owner is None:
            return None
        if reason is None:
            try:
                _remove_tree(parent_fd, dir_fd, os.path.basename(path))
            except OSError as exc:
                reason = f"could not remove it: {exc.strerror or exc}"
        if reason:
            return CleanAction(path, owner, "kept", reason)
        return CleanAction(path, owner, "removed", mine)
    finally:
        os.close(dir_fd)
        os.close(parent_fd)


def _keep_reason_at(dir_fd: int, path: str, session: str, opened: list[Opener]
                    ) -> tuple[Owner | None, str | None]:
    owner, untrusted = read_owner_at(dir_fd)
    if owner is None:
        return None, None
    if owner.session != session:
        where = f" on {owner.host}" if owner.host and owner.host != socket.gethostname() else ""
        return owner, (f"owned by session {owner.session or '(unknown)'}{where} ({owner.purpose}; "
                       f"claimed {claimed_when(owner.created)})")
    if untrusted is not None:
        return owner, f"its owner file {untrusted}; not trusted"
    if opened:
        shown = ", ".join(o.text() for o in opened[:MAX_SHOWN_OPENERS])
        more = f" and {len(opened) - MAX_SHOWN_OPENERS} more" if len(opened) > MAX_SHOWN_OPENERS else ""
        return owner, f"open: {shown}{more}"
    try:
        return owner, _blocker_inside(dir_fd, path, session)
    except OSError as exc:
        return owner, f"cannot inspect it: {exc.strerror}"


def clean_lines(data: dict[str, Any]) -> list[str]:
    """The human form of ``clean``'s result."""
    lines = []
    for d in data["directories"]:
        verb = {"removed": "removed", "would-remove": "would remove", "kept": "kept"}[d["action"]]
        owner = d["owner"]
        if d["action"] == "kept":
            lines.append(f"{verb} {d['path']}: {d['reason']}")
        else:
            lines.append(f"{verb} {d['path']} (session {owner['session']}: {owner['purpose']})")
    if not data["directories"]:
        lines.append(f"no claimed directories under {data['root']}")
    if data["unclaimed"]:
        shown = ", ".join(os.path.relpath(p, data["root"]) for p in data["unclaimed"][:10])
        more = f", … ({len(data['unclaimed'])} in all)" if len(data["unclaimed"]) > 10 else ""
        lines.append(f"left alone (unclaimed): {shown}{more}")
    if data["hidden_processes"]:
        lines.append(hidden_note(data["hidden_processes"]))
    return lines


def hidden_note(count: int, euid: int | None = None) -> str:
    """The note under a listing when ``count`` processes could not be inspected: a normal user is
    told that root can see them; root, that even it was refused (another user namespace, a
    security module such as Yama or SELinux), so running it as root would not help."""
    if (os.geteuid() if euid is None else euid) == 0:
        why = "permission denied even to root: a process in another user namespace or under a security module"
    else:
        why = "permission denied: other users' processes; as root they can be"
    return f"note: {count} processes could not be inspected for open files ({why})"
