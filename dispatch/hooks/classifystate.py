"""One classification's state, shared by the walk (``classify``), the prefix handlers (``prefixes``)
and the script reader (``scripts``).

The walk is recursive through all three (a prefix runs a command, a script holds commands, a
command names a script), but only ``classify`` imports the other two: they reach the walk again
through the ``Walk`` callbacks the ``Context`` carries, so no two of these modules import each other.
Standard library only and light to import, as ``classify`` is (it runs before every agent command).
"""

from __future__ import annotations

import time

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Callable, Mapping

    from dispatch.hooks import rules
    from dispatch.hooks.shellwords import Simple

SHELLS = frozenset(("sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "fish"))


def is_python(name: str) -> bool:
    """Whether the program ``name`` (a base name) is a Python interpreter (``python3.12``, ``pypy3``)."""
    return name.startswith(("python", "pypy")) and name.rstrip("0123456789.").endswith(("python", "pypy"))


class Done(Exception):
    """Everything a verdict can say is known: stop reading."""


class Walk(NamedTuple):
    """The walk's steps that the prefix handlers and the script reader call back into.

    ``text``: every simple command of a text (``line_base``: a script's name, for ``why``);
    ``argv``: one command's words (with the command it came from and the one piped into it, if any);
    ``decide``: the patterns on one command's words (``read_script``: a script named by path with no
    pattern is read); ``hostrun``: the arguments after ``hostrun``.
    """

    text: Callable[[Context, str, Site, str | None], None]
    argv: Callable[[Context, list[str], Site, Simple | None, Simple | None, bool], None]
    decide: Callable[[Context, list[str], Site, bool, bool], None]
    hostrun: Callable[[Context, list[str], Site, bool], None]


class Context:
    """One decision's state: the tables, the limits, the files read, what was found so far, and
    the walk to call back into."""

    def __init__(self, table: rules.Table, env: Mapping[str, str], deadline_s: float,
                 max_depth: int, max_bytes: int, unknown_heavy: bool, walk: Walk) -> None:
        self.table, self.env, self.deadline_s, self.walk = table, env, deadline_s, walk
        self.deadline = time.monotonic() + deadline_s
        self.max_depth, self.max_bytes, self.unknown_heavy = max_depth, max_bytes, unknown_heavy
        self.seen: set[str] = set()
        self.heavy_direct: str | None = None
        self.heavy_through: str | None = None
        self.gpu: str | None = None
        self.light: str | None = None
        self.unknown: str | None = None
        self.hostrun_job = False
        self.aliases: dict[str, list[str]] = {}  # ``alias c=cargo`` earlier in the line: c is cargo
        self.written: dict[str, str] = {}  # files this line writes before running them: path -> text

    def found(self, heavy: bool, gpu: bool, why: str, through: bool) -> None:
        if heavy and through:
            self.heavy_through = self.heavy_through or why
        elif heavy:
            self.heavy_direct = self.heavy_direct or why
        elif self.light is None:
            self.light = why
        if gpu:
            self.gpu = self.gpu or why
        if self.heavy_direct and self.gpu:
            raise Done

    def give_up(self, why: str, site: Site) -> None:
        """Reading stopped at a limit: unknown, which counts heavy when ``unknown_heavy``."""
        self.unknown = self.unknown or why
        if self.unknown_heavy:
            self.found(True, False, f"unknown, counted heavy: {why}{at(site)}", site.through)

    def late(self, site: Site) -> bool:
        if time.monotonic() > self.deadline:
            if not self.unknown:
                self.give_up(f"time limit of {self.deadline_s * 1000:.0f} ms reached", site)
            return True
        return False

    def text(self, text: str, site: Site, line_base: str | None = None) -> None:
        """Judge every simple command of ``text`` (the walk's ``text``)."""
        self.walk.text(self, text, site, line_base)

    def words(self, words: list[str], site: Site, gpu_env: bool) -> None:
        """Judge one command given as words, prefixes and all (the walk's ``argv``)."""
        self.walk.argv(self, words, site, None, None, gpu_env)

    def decide(self, words: list[str], site: Site, gpu_env: bool, read_script: bool = True) -> None:
        """Let the patterns judge ``words`` (the walk's ``decide``)."""
        self.walk.decide(self, words, site, gpu_env, read_script)

    def hostrun(self, args: list[str], site: Site, gpu_env: bool) -> None:
        """Judge ``hostrun ARGS`` (the walk's ``hostrun``)."""
        self.walk.hostrun(self, args, site, gpu_env)


class Site:
    """Where a command runs: its directory (``cd`` moves it for the commands after), how deep in
    scripts, the location shown in ``why``, and whether it runs inside a hostrun job."""

    def __init__(self, cwd: str, depth: int, where: str, through: bool) -> None:
        self.cwd, self.depth, self.where, self.through = cwd, depth, where, through

    def child(self, where: str | None = None, through: bool | None = None, deeper: bool = True) -> Site:
        return Site(self.cwd, self.depth + deeper, self.where if where is None else where,
                     self.through if through is None else through)


def at(site: Site) -> str:
    """`` in WHERE`` for a ``why``: the script line or ``-c`` string the command stands in."""
    return f" in {site.where}" if site.where else ""


def inside(site: Site, what: str) -> Site:
    """A site for a command string run by ``what`` (``bash -c``), shown as where it stands."""
    return site.child(f"{what}{at(site)}")


def shown(argv: list[str]) -> str:
    """A command as ``why`` shows it: its words, cut at 60 characters."""
    text = " ".join(argv)
    return text if len(text) <= 60 else text[:57] + "..."
