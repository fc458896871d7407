"""What a heavy command becomes under ``wrap`` and what ``guard`` tells the agent to run instead:
``hostrun --session S --label L [-m CAP] --long-job-rule [--gpu-memory auto] -- bash -c '<the
original>'``; and the guard's escape.

The original line runs unchanged inside ``bash -c`` (its ``cd``, ``&&`` chains, pipes and ``FOO=1``
prefixes included), in the directory the agent's shell is in, and hostrun exits with its exit code.
The label names the project and the deciding command (``myproj:cargo-test``), so that runs of the
same kind share a history; ``-m`` is the half rule on that label's worst recorded peak (at most the
slice), so a label that has run before is capped at twice what it needed. ``--long-job-rule`` makes
a job recorded longer than ``long_job_threshold`` exit 244 unless declared long, as ``--auto`` would;
a GPU command on a host with GPUs books ``--gpu-memory auto`` (its label's recorded VRAM peak and a
quarter, else ``default_gpu_memory``).
"""

from __future__ import annotations

import os
import shlex
import sys

from dispatch.hooks import rules
from dispatch.hooks.shellwords import parse

MYPY = False
if MYPY:
    from collections.abc import Sequence

LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+:")


def project_root(cwd: str) -> str:
    """The git top level above ``cwd`` (a ``.git`` directory or file), else ``cwd`` itself."""
    path = os.path.abspath(cwd)
    while True:
        if os.path.exists(os.path.join(path, ".git")):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return os.path.abspath(cwd)
        path = parent


def _clean(word: str) -> str:
    return "".join(ch if ch in LABEL_CHARS else "_" for ch in word).strip("_")[:40]


def derive_label(why: str, cwd: str) -> str | None:
    """``<project>:<program>[-<arg>...]`` from the verdict's deciding command and its pattern
    (``cargo test --workspace [heavy: cargo test]`` → ``myproj:cargo-test``): the program's base
    name and as many positional arguments as the pattern names. None when ``why`` names no pattern
    (a reading cut short): hostrun then labels the run by its whole command."""
    text, bracket, rest = why.partition(" [")
    kind, colon, pattern = rest.partition(": ")
    if not bracket or not colon or kind not in (rules.HEAVY, rules.GPU):
        return None
    pattern = pattern.partition("]")[0]
    words = text.split()
    if not words or text.endswith("..."):
        words = words[:-1] if len(words) > 1 else words
    if not words:
        return None
    name = rules.tool_name(words[0])
    wanted = len([w for w in pattern.split()[1:] if not w.startswith("-")])
    positionals, _ = rules.split_args(name, words[1:])
    parts = [_clean(name)] + [_clean(p) for p in positionals[:wanted]]
    project = _clean(os.path.basename(project_root(cwd))) or "project"
    return f"{project}:{'-'.join(p for p in parts if p) or 'job'}"


def half_rule_cap(worst_peak: int, slice_limit: int | None) -> int | None:
    """Twice the worst peak rounded up to 512 MiB (docs/capacity.md), or None when there is no
    history or it would not fit the slice (hostrun then books as it always does)."""
    if worst_peak <= 0:
        return None
    from dispatch.local.capacity import half_rule_cap as rule  # the one rule, docs/capacity.md

    cap = rule(worst_peak)
    if slice_limit is not None and cap > slice_limit:
        return None
    return cap


def hostrun_argv(config: str | None) -> list[str]:
    """How the rewritten line calls hostrun: this very hostrun (its absolute path, or this Python
    with ``-m dispatch``), with ``--config`` when the hook was given one."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "hostrun" and os.path.isfile(argv0):
        argv = [os.path.abspath(argv0)]
    else:
        argv = [sys.executable, "-m", "dispatch"]
    if config:
        argv += ["--config", os.path.abspath(config)]
    return argv


def wrapped(command: str, hostrun: Sequence[str], session: str | None, label: str | None,
            cap: int | None, gpu: bool = False) -> str:
    """The line that runs ``command`` through hostrun, keeping its directory, environment prefixes
    and exit code. ``agent_options`` come with it: the long-job rule, and for a GPU command on a
    host with GPUs (``gpu``) the VRAM its label used before."""
    argv = list(hostrun)
    if session:
        argv += ["--session", session]
    if label:
        argv += ["--label", label]
    if cap:
        argv += ["-m", f"{cap >> 20}M"]
    argv += agent_options(gpu)
    line = " ".join(shlex.quote(a) for a in argv)
    return f"{line} -- bash -c {shlex.quote(command)}"


def agent_options(gpu: bool) -> list[str]:
    """What every run an agent's command becomes carries (the hooks' rewrite, the shims): the
    dispatcher's long-job rule (244, as ``--auto`` applies it), and with ``gpu`` a VRAM booking
    from the label's recorded VRAM peak (``--gpu-memory auto``)."""
    return ["--long-job-rule", *(["--gpu-memory", "auto"] if gpu else [])]


def escape_reason(command: str, name: str) -> str | None:
    """The reason given with the guard's escape, ``NAME="reason" cmd``: an assignment of ``name``
    in front of the line's first command (or ``export NAME=…`` as its first command), else None."""
    try:
        commands = parse(command).commands
    except Exception:  # a line that cannot be read has no escape
        return None
    if not commands:
        return None
    first = commands[0].words
    prefix = name + "="
    if first and first[0] == "export" and len(first) >= 2:
        first = first[1:]
    for word in first:
        if word.startswith(prefix):
            return word[len(prefix):]
        head, eq, _ = word.partition("=")
        if not (eq and head.isidentifier()):
            break
    return None
