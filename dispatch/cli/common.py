"""What the command modules of ``dispatch.cli`` share: the registry of subcommands, argparse
(imported only off the hot path) with one-line usage errors, the plain-option parser, and how a
command says things, prints other sessions' words and loads the configuration."""

from __future__ import annotations

import os
import sys

from dispatch.core import PROG, ExitCode, UsageError, whole_number
from dispatch.core import SUBCOMMANDS as SUBCOMMANDS

MYPY = False
if MYPY:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn, TypeVar

    from dispatch.core import Settings

    T = TypeVar("T")

# Each subcommand's handler: name -> (module of dispatch.cli, function), in ``SUBCOMMANDS``' order
# (tests/fast/test_surfaces.py). A command's module is imported only when it runs, so ``hostrun -- CMD``
# loads ``runcmd`` alone.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("runcmd", "cmd_run"), "doctor": ("statecmds", "cmd_doctor"),
    "codes": ("statecmds", "cmd_codes"), "ledger": ("statecmds", "cmd_ledger"),
    "report": ("statecmds", "cmd_report"), "dispatch": ("runcmd", "cmd_dispatch"),
    "alerts": ("alertcmds", "cmd_alerts"), "capacity": ("statecmds", "cmd_capacity"),
    "lock": ("guardcmds", "cmd_lock"), "workdir": ("guardcmds", "cmd_workdir"),
    "preflight": ("guardcmds", "cmd_preflight"), "history": ("statecmds", "cmd_history"),
    "hook": ("setupcmds", "cmd_hook"), "agents": ("setupcmds", "cmd_agents"),
    "watch": ("alertcmds", "cmd_watch"), "shims": ("setupcmds", "cmd_shims"),
    "shared": ("setupcmds", "cmd_shared"), "top": ("topcmd", "cmd_top"),
    "completion": ("completion", "cmd_completion"), "session": ("sessioncmd", "cmd_session"),
}
USAGE = (f"{PROG} [RUN OPTIONS] -- CMD [ARGS...]\n       {PROG} {{{','.join(SUBCOMMANDS[1:])}}} ...")


def argparser(prog: str, description: str) -> argparse.ArgumentParser:
    """argparse (imported only off the hot path), but a usage error is one line and exit 2."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"{message} (see '{self.prog} --help')")

    class Formatter(argparse.HelpFormatter):
        """argparse builds a formatter for every ``add_argument``, and the default one imports
        ``shutil`` (with ``bz2``, ``lzma``, ``fnmatch``: ~3 ms) for the terminal width."""

        def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                     width: int | None = None) -> None:
            super().__init__(prog, indent_increment, max_help_position,
                             terminal_columns() - 2 if width is None else width)

    return Parser(prog=prog, description=description, formatter_class=Formatter)


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: ``$COLUMNS``, else the terminal's, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def sub_parser(name: str, help_text: str, json_flag: bool = True) -> argparse.ArgumentParser:
    p = argparser(f"{PROG} {name}", help_text)
    p.add_argument("--config", metavar="PATH", help="configuration file")
    if json_flag:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


class PlainArgs:
    """What ``plain_args`` parsed: the attributes argparse would have set."""


def plain_args(argv: list[str], switches: Sequence[str], repeated: Sequence[str],
               single: Sequence[str] = ("config",)) -> PlainArgs | None:
    """The exact long forms (``--json``, ``--host NAME``, ``--host=NAME``) parsed without argparse,
    whose import and parser cost ~7 ms on a command an agent may run before every heavy job. Anything
    else (help, an abbreviation, a value that looks like an option, an unknown word) gives None, and
    argparse parses it all: the answer is the same, and so are the errors."""
    flags = {name: False for name in switches}
    values: dict[str, list[str]] = {name: [] for name in (*repeated, *single)}
    i = 0
    while i < len(argv):
        word, i = argv[i], i + 1
        key, eq, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        dest = key.replace("-", "_")
        if dest in flags and not eq:
            flags[dest] = True
            continue
        if dest not in values:
            return None
        if not eq:
            if i >= len(argv) or argv[i].startswith("-"):
                return None
            value, i = argv[i], i + 1
        values[dest].append(value)
    parsed = PlainArgs()
    parsed.__dict__.update(flags)
    parsed.__dict__.update({name: values[name] or None for name in repeated})
    parsed.__dict__.update({name: values[name][-1] if values[name] else None for name in single})
    return parsed


def say(line: str) -> None:
    from dispatch.core import printable  # a message may quote a label, a path or a peer's words

    print(f"{PROG}: {printable(line)}", file=sys.stderr, flush=True)


def print_lines(lines: Sequence[str]) -> None:
    """Lines that quote other sessions' words (lock holders, owners, alerts): escaped first."""
    from dispatch.core import printable

    if lines:
        print("\n".join(printable(line) for line in lines), flush=True)


def load_config(config: str | None) -> Settings:
    """The settings (``--config`` or the usual places), pydantic imported only when they are validated."""
    from dispatch.config import load_settings

    return load_settings(config)


def history_limit(text: str) -> int:
    value = whole_number(text)
    if value < 0:
        raise ValueError(f"must be 0 (all) or more: {value}")
    return value


def option_value(option: str, text: str, parse: Callable[[str], T]) -> T:
    """``text`` as ``parse`` reads it; its ValueError, which says what is wrong with the value, becomes
    the usage error (argparse's own ``type=`` would print only the parser function's name)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise UsageError(f"argument {option}: {exc}") from None


def subaction(name: str, argv: list[str], actions: dict[str, str], args_usage: str, title: str,
            lines: tuple[str, ...], json_for: tuple[str, ...] | None = None
            ) -> tuple[str, argparse.ArgumentParser, list[str]] | None:
    """``hostrun NAME ACTION ...``: the action, its parser (``actions[ACTION]`` is its description;
    ``--json`` for the actions in ``json_for``, all when None) and the rest of argv; None after
    printing the help (``-h``); a missing or unknown action is a UsageError naming the actions."""
    if argv and argv[0] in actions:
        action = argv[0]
        parser = sub_parser(f"{name} {action}", actions[action],
                            json_flag=json_for is None or action in json_for)
        return action, parser, argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} {name} {{{','.join(actions)}}} {args_usage}\n\n{title}:\n"
              + "\n".join(f"  {line}" for line in lines))
        return None
    raise UsageError(f"{name}: choose one of {', '.join(actions)} (see '{PROG} {name} --help')")


def check_hosts(settings: Any, names: list[str] | None) -> None:
    for name in names or []:
        if name not in settings.hosts:
            raise UsageError(f"--host {name}: no such host (configured: {', '.join(settings.hosts)})")


def readings_status(settings: Any, readings: list[Any]) -> int:
    """``report``'s and ``capacity``'s exit code: 78 when this host's own report failed (e.g. a forced
    backend), else 246 when a peer's did, else 0. A 78 says why on stderr, as every other 78 does
    (the table or JSON on stdout may be read by a script, or not at all)."""
    from dispatch.core import printable
    from dispatch.hosts import host_for

    own = [r for r in readings if not r.ok and host_for(settings, r.host).is_here]
    if own:
        for r in own:
            print(f"{PROG}: error: host {r.host}: {printable(str(r.error))}", file=sys.stderr)
        return int(ExitCode.NOT_RUN)
    return 0 if all(r.ok for r in readings) else int(ExitCode.PEER_UNREACHABLE)
