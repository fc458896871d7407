"""``hostrun shims install|uninstall|list DIR``: PATH wrappers for agents and scripts without hooks.

A shim is a small Python script named like the tool (``cargo``), run by the interpreter that installed
it (``-I``: no ``PYTHONPATH`` or user site steers it) with hostrun's own package directory put first on
its path; it calls ``dispatch.cli.shim.main``. A Python script rather than a ``#!/bin/sh`` one that
starts Python: one interpreter start fewer per command (``bench/bench_shims.py`` measures both).

DIR must be a directory of the caller's that nobody else can write, under directories only the caller
or root can write (``dispatch.guards.trust.own_dir``; created 0755 when missing): a shim runs on every
build command, so whoever can write DIR could run anything as its user. Shims are files of mode 0755
written atomically; each carries ``dispatch.hooks.shimpath.MARKER``, and only files with it are replaced,
listed or removed: a user's own file of the same name is never touched.
"""

from __future__ import annotations

import os
import stat
import sys

from dispatch.core.atomicfile import temporary_name
from dispatch.core.errors import UsageError
from dispatch.hooks.shimpath import MARKER, find_real, is_shim

MYPY = False
if MYPY:
    from typing import Any

DEFAULT_TOOLS = ("cargo", "make", "ninja", "cmake", "pytest", "tox", "go", "npm", "pnpm", "yarn",
                 "mvn", "gradle", "bazel")


def parse_tools(text: str | None) -> list[str]:
    """``--tools a,b``: plain file names, each once; UsageError (2) otherwise."""
    if text is None:
        return list(DEFAULT_TOOLS)
    from dispatch.core.text import check_name

    tools: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        check_name(name, "--tools")
        if "/" in name or name in (".", "..") or name.startswith("-"):
            raise UsageError(f"--tools: {name!r} is not a program name")
        if name == "hostrun":
            raise UsageError("--tools: hostrun itself cannot be shimmed")
        if name not in tools:
            tools.append(name)
    return tools


def shim_text(tool: str) -> str:
    """The shim for ``tool``: this interpreter, this hostrun's package directory, the marker."""
    python = sys.executable
    if not python or any(ch.isspace() for ch in python) or len(python) > 120:
        raise UsageError(f"cannot write a '#!' line for this Python ({python!r}): install hostrun "
                         "under a path without blanks")
    import dispatch

    root = os.path.dirname(os.path.dirname(os.path.abspath(dispatch.__file__)))
    return (f"#!{python} -I\n"
            f"{MARKER.decode()}{tool} (written by 'hostrun shims install'; "
            "'hostrun shims uninstall DIR' removes it)\n"
            "import sys\n"
            f"sys.path.insert(0, {root!r})\n"
            "from dispatch.cli.shim import main\n"
            f"main({tool!r}, __file__)\n")


def _checked_dir(path: str, create: bool) -> str:
    from dispatch.guards.trust import own_dir

    if create and not os.path.lexists(path):
        parent = own_dir(os.path.dirname(os.path.abspath(path)) or "/", "the parent of shim directory")
        try:
            os.mkdir(os.path.join(parent, os.path.basename(os.path.abspath(path))), 0o755)
        except FileExistsError:
            pass  # made meanwhile: checked below like any other
    return own_dir(path, "shim directory")


def install(directory: str, tools: list[str]) -> list[str]:
    """Write a shim per tool into ``directory``; the paths written. A file of a tool's name that is
    not a shim of ours refuses the whole install (UsageError) before anything is written."""
    where = _checked_dir(directory, create=True)
    for tool in tools:
        path = os.path.join(where, tool)
        if os.path.lexists(path) and not (os.path.isfile(path) and is_shim(path)):
            raise UsageError(f"{path} exists and is not a hostrun shim: not replacing it (remove it, "
                             f"or leave {tool} out of --tools)")
    written = []
    for tool in tools:
        path = os.path.join(where, tool)
        tmp = temporary_name(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700)
        try:
            os.write(fd, shim_text(tool).encode())
            os.fchmod(fd, 0o755)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o755:
            raise UsageError(f"{path}: not the shim just written (mode {stat.S_IMODE(st.st_mode):04o})")
        written.append(path)
    return written


def _ours(where: str) -> list[str]:
    try:
        names = sorted(os.listdir(where))
    except OSError as exc:
        raise UsageError(f"cannot list {where}: {exc.strerror}") from None
    return [n for n in names if os.path.isfile(os.path.join(where, n)) and
            not os.path.islink(os.path.join(where, n)) and is_shim(os.path.join(where, n))]


def uninstall(directory: str) -> list[str]:
    """Remove the shims of ours from ``directory``; the paths removed (other files stay)."""
    where = _checked_dir(directory, create=False)
    removed = []
    for name in _ours(where):
        path = os.path.join(where, name)
        os.unlink(path)
        removed.append(path)
    return removed


def listing(directory: str) -> list[dict[str, Any]]:
    """Each shim of ours in ``directory``: its tool, path, and the real tool it would run now."""
    where = _checked_dir(directory, create=False)
    return [{"tool": name, "path": os.path.join(where, name), "real": find_real(name, where)}
            for name in _ours(where)]
