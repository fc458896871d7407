"""Whom a root-run hostrun trusts (docs/trust.md): what the invoking user or root owns and nobody else
can write.

hostrun often runs as root next to other users, and what it reads steers what it runs: a config file
names an ``ssh_config`` (whose ``ProxyCommand`` is a command), an identity file and a state directory;
the ControlMaster socket directory decides where root's ssh traffic goes. So:

* a file (config, ``ssh_config``, ``identity_file``) must be owned by the invoking user (the effective
  uid) or root and not writable by group or others, and so must every directory and symlink on the
  path as written, from ``/`` down (a sticky directory such as ``/tmp`` is fine: others cannot
  replace an entry of ours in it). ``HOSTRUN_TRUST_CONFIG``
  (absolute paths, ``:``-separated) names files trusted anyway, as git's ``safe.directory`` does;
* a directory hostrun keeps things in is created 0700 and then checked with ``lstat``: a real directory
  (not a symlink), owned by us, writable by nobody else; one of ours that others cannot write is
  tightened to 0700, anything else is refused, never reused. Every directory above it must be owned by
  us or root and be writable by nobody else unless it is sticky (``/tmp``).

Standard library only and no imports beyond ``os``/``stat`` on the hot path: the checks are a few
``stat`` calls. A refusal raises UntrustedPathError (exit 2) naming the path, its owner and mode, and
the fix.
"""

from __future__ import annotations

import os
import stat

from dispatch.core.errors import UntrustedPathError

MYPY = False
if MYPY:
    from collections.abc import Callable, Mapping

OPT_IN = "HOSTRUN_TRUST_CONFIG"
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def _owner_problem(st: os.stat_result) -> str | None:
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by {_user(st.st_uid)}, not by you or root"
    return None


def _write_problem(st: os.stat_result) -> str | None:
    if st.st_mode & _OTHERS_WRITE:
        who = "group and others" if st.st_mode & _OTHERS_WRITE == _OTHERS_WRITE else \
            "its group" if st.st_mode & stat.S_IWGRP else "others"
        return f"writable by {who} (mode {_mode(st)})"
    return None


def _ancestor_problem(st: os.stat_result) -> str | None:
    """A directory above something we trust: ours or root's, and only they can add or remove entries
    (or it is sticky, so nobody can remove ours)."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_mode & stat.S_ISVTX:
        return _owner_problem(st)
    return _owner_problem(st) or _write_problem(st)


def opted_in(path: str, environ: Mapping[str, str]) -> bool:
    """``path`` is named in ``HOSTRUN_TRUST_CONFIG`` (compared after resolving symlinks)."""
    listed = environ.get(OPT_IN)
    if not listed:
        return False
    real = os.path.realpath(path)
    return any(os.path.isabs(entry) and os.path.realpath(entry) == real
               for entry in listed.split(os.pathsep) if entry)


MAX_LINKS = 40  # as the kernel's limit on symlinks followed in one path


def file_problem(path: str, st: os.stat_result | None = None) -> str | None:
    """Why the file ``path`` cannot be trusted, or None: it, and **every component of the path as
    written** (each directory, and each symlink followed, with the path its target names), must be
    owned by you or root, and the directories writable by nobody else unless sticky.

    Judging only the file and its real directory is not enough: the path is opened later by another
    program (ssh), and a directory or link on the way that another user owns lets them swap what it
    names in between (a link flipped every few ms did it). When every component is yours or root's,
    nobody else can change what the path names. A path not there (yet) is judged as far as it
    exists, and refused if the missing part could be created by someone else (in ``/tmp``).
    (``st`` is unused: the walk ``lstat``s every component itself; callers may still pass it.)"""
    try:  # the file itself first: its own owner or mode is the likeliest, and most useful, answer
        final = os.stat(path)
        problem = _owner_problem(final) or _write_problem(final)
    except FileNotFoundError:
        problem = None
    if problem:
        return f"it is {problem}"
    whole = path if path.startswith("/") else os.path.join(os.getcwd(), path)  # (a cwd may be gone)
    components = whole.split("/")  # as written: no normalising of ".."
    todo = [c for c in reversed(components) if c not in ("", ".")]
    current = "/"
    problem = _ancestor_problem(os.lstat("/"))
    if problem:
        return f"/ on its path is {problem}"
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)  # ``current`` is a real directory: its parent is sure
            continue
        here = os.path.join(current, part)
        try:
            lst = os.lstat(here)
        except FileNotFoundError:
            # Judged as far as it exists: in a directory only you or root can write, nobody else can
            # create the rest; in one others can write (sticky or not), anyone could, at any moment.
            if os.lstat(current).st_mode & _OTHERS_WRITE:
                return f"{here} does not exist, and others can create it in {current}"
            return None
        if stat.S_ISLNK(lst.st_mode):
            links += 1
            if links > MAX_LINKS:
                return f"{here} is one symlink too many on its path"
            owner = _owner_problem(lst)
            if owner:
                return f"the symlink {here} on its path is {owner}"
            target = os.readlink(here)
            if target.startswith("/"):
                current = "/"
            todo.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
            continue
        if not todo:  # the file itself
            problem = _owner_problem(lst) or _write_problem(lst)
            return f"it is {problem}" if problem else None
        problem = _ancestor_problem(lst)
        if problem:
            return f"{here} on its path is {problem}"
        current = here
    return None


def check_file(path: str, what: str, environ: Mapping[str, str], st: os.stat_result | None = None) -> None:
    """Refuse the file ``path`` unless it is trusted (see the module docstring) or opted in.

    ``what`` names it in the message (e.g. "config file", "hosts.x.ssh_config in /etc/hosts.toml");
    ``st`` is its ``os.stat`` when the caller has it (the config loader stats the file anyway).
    """
    problem = file_problem(path, st)
    if problem is None or opted_in(path, environ):
        return
    absolute = os.path.abspath(path)
    if problem.startswith("it is writable"):
        fix = f"chmod go-w {absolute}"
    elif problem.startswith("it is owned"):
        fix = f"if you trust it, chown {_user(os.geteuid()).split(' ')[0]} {absolute}"
    else:
        fix = "move it to a directory that only you or root can write"
    raise UntrustedPathError(f"refusing {what} {absolute}: {problem}; fix: {fix}, or trust exactly "
                             f"this file with {OPT_IN}={absolute}")


def own_file_ok(st: os.stat_result) -> bool:
    """A file we wrote ourselves and nobody else can write (the config cache)."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & _OTHERS_WRITE


def private_dir_ok(path: str) -> bool:
    """``path`` is a real directory of ours that nobody else can write (no symlink followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & _OTHERS_WRITE


def _dir_problem(st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by {_user(st.st_uid)}, not by you"
    return _write_problem(st)


def check_existing_dir(path: str, what: str) -> None:
    """Refuse ``path`` if it exists and is not a private directory of ours (nothing is created)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    problem = _dir_problem(st)
    if problem:
        raise UntrustedPathError(f"refusing {what} {path}: it is {problem}; fix: use a directory "
                                 f"of your own that only you can write (mode 0700)")


def private_dir(path: str, fix: str = "choose another path") -> str:
    """Make ``path`` a directory only we can use, and return it with its parent resolved.

    Missing directories are created 0700 (parents too); then the leaf is checked with ``lstat``: a
    real directory owned by us that nobody else can write (an own one with looser read bits is
    tightened to 0700). Every directory above it must be ours or root's, and writable by nobody else
    unless sticky. Anything else raises UntrustedPathError (``fix`` ends its advice): another user's
    directory is never reused.
    """
    def make(current: str, _leaf: str) -> None:
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            pass  # made by a concurrent run: checked like any other

    def refuse(leaf: str, why: str) -> UntrustedPathError:
        return UntrustedPathError(f"refusing directory {leaf}: {why}; hostrun keeps its files only "
                                  f"where nobody else can write; fix: remove it if it is not yours, or {fix}")

    leaf, st = _walk(path, make, refuse)
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(leaf, 0o700)  # ours and nobody else can write it: only tighten what others may read
    return leaf


def own_dir(path: str, what: str) -> str:
    """``path`` resolved, if it is an existing directory of ours that nobody else can write, with
    every directory above it ours or root's and writable by nobody else unless sticky (others may
    read and search it: a PATH directory). UntrustedPathError (exit 2) otherwise, nothing created."""
    def missing(current: str, leaf: str) -> None:
        raise UntrustedPathError(f"refusing {what} {leaf}: {current} does not exist")

    def refuse(leaf: str, why: str) -> UntrustedPathError:
        return UntrustedPathError(f"refusing {what} {leaf}: {why}; fix: use a directory of your own "
                                  "that only you can write")

    leaf, _ = _walk(path, missing, refuse)
    return leaf


def _walk(path: str, on_missing: Callable[[str, str], None],
          refuse: Callable[[str, str], UntrustedPathError]) -> tuple[str, os.stat_result]:
    """``path`` with its parent resolved, and its ``lstat``: every directory from ``/`` down to it
    checked (the leaf by ``_dir_problem``, those above by ``_ancestor_problem``). A missing one goes
    to ``on_missing(current, leaf)`` (which makes it, or raises); a bad one raises ``refuse(leaf,
    why)``."""
    absolute = os.path.abspath(path)
    leaf = os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))
    current = "/"
    for part in leaf.split("/")[1:]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            on_missing(current, leaf)
            st = os.lstat(current)
        problem = _dir_problem(st) if current == leaf else _ancestor_problem(st)
        if problem:
            raise refuse(leaf, "it is " + problem if current == leaf else f"{current} above it is {problem}")
    return leaf, st
