"""The run options of ``hostrun [OPTIONS] -- CMD``: one table, a fast parser, a typed record.

This module is on the hot path of every ``hostrun -- CMD``: it parses without argparse (whose import
and set-up cost ~8 ms per call), imports only the standard library at import time, and loads the
converters' helpers (``dispatch.core.units``, ``dispatch.core.text``) only when an option needs them. The same
table (``RUN_OPTIONS``) drives ``hostrun --help``, which the CLI builds with argparse off the hot path.
"""

from __future__ import annotations

import os

from dispatch.core.errors import UsageError
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence
    from typing import Any

PROG = "hostrun"
MAX_THREADS = 4096  # far above any machine hostrun shares; a larger count is a typo, not a plan


class RunOptions(NamedTuple):
    """The parsed run options, one field per option (the field is the option's ``dest``).

    A flag is False when absent; ``--peer``/``--long-job`` are True when bare and their text with
    ``=VALUE``; ``--return`` collects its values in order.
    """

    config: str | None = None
    memory_cap: int | None = None
    label: str | None = None
    max_runtime: float | None = None
    threads: int | None = None
    result_file: str | None = None
    no_cap: bool = False
    session: str | None = None
    gpu_memory: int | str | None = None  # bytes, or GPU_AUTO
    auto: bool = False
    peer: str | bool = False
    host: str | None = None
    expect_duration: float | None = None
    long_job: str | bool = False
    long_job_rule: bool = False
    tree: str | None = None
    returns: tuple[str, ...] = ()
    stdin: bool = False
    force: bool = False
    group: str | None = None
    when_idle: bool = False
    requeue: bool = False


def cap_size(text: str) -> int:
    """A memory size for a cap (``4G``); below 1 MiB nothing could run under it."""
    from dispatch.core.units import MIN_SIZE, parse_size

    size = parse_size(text)
    if size < MIN_SIZE:
        raise ValueError(f"too small: {text!r} (a cap below 1M cannot run anything)")
    return size


GPU_AUTO = "auto"


def gpu_size(text: str) -> int | str:
    """``--gpu-memory``: a size, or ``auto`` (what the label's recorded VRAM peak says)."""
    return GPU_AUTO if text == GPU_AUTO else cap_size(text)


def duration(text: str) -> float:
    from dispatch.core.units import parse_duration

    return parse_duration(text)


def positive_duration(text: str) -> float:
    value = duration(text)
    if value <= 0:
        raise ValueError(f"must be longer than 0: {text!r}")
    return value


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None


def thread_count(text: str) -> int:
    value = whole_number(text)
    if not 1 <= value <= MAX_THREADS:
        raise ValueError(f"must be from 1 to {MAX_THREADS}: {value}")
    return value


def checked_name(what: str) -> Callable[[str], str]:
    """A label or group name: no control characters (they are printed in other sessions' output)."""
    def convert(text: str) -> str:
        from dispatch.core.text import check_name

        return check_name(text, what) or text

    return convert


def job_label(text: str) -> str:
    """A job's ``--label``: a name (``checked_name``), and not ``session:…``, which is an agent
    session's (``hostrun session --label``): its peaks size sessions, and it is booked as one."""
    from dispatch.core.settings import SESSION_LABEL_PREFIX

    label = checked_name("--label")(text)
    if label.startswith(SESSION_LABEL_PREFIX):
        from dispatch.core.errors import UsageError

        raise UsageError(f"--label {label}: labels {SESSION_LABEL_PREFIX}NAME are agent sessions' "
                         f"(hostrun session --label NAME -- CMD)")
    return label


def resolve_session(explicit: str | None) -> str | None:
    """``--session``, else ``$HOSTRUN_SESSION``, checked like a label; None when neither is set."""
    if explicit:
        return explicit  # already checked by its option's converter
    named = os.environ.get("HOSTRUN_SESSION")
    if not named:
        return None
    from dispatch.core.text import check_name

    return check_name(named, "HOSTRUN_SESSION")


# The subcommands' names, in the order --help lists them. Their handlers are the command line's
# (``dispatch.cli.common.COMMANDS``); the names are declared here, below it, because the hooks'
# classifier reads them too (``hostrun top`` is a subcommand, not a heavy command).
SUBCOMMANDS = ("run", "doctor", "codes", "ledger", "report", "dispatch", "alerts", "capacity", "lock",
               "workdir", "preflight", "history", "hook", "agents", "watch", "shims", "shared", "top",
               "completion", "session")


class Option:
    """One run option: the single table behind both the fast parser and ``--help``."""

    def __init__(self, flags: tuple[str, ...], dest: str, help: str, metavar: str | None = None,
                 convert: Callable[[str], Any] = str, optional_value: bool = False,
                 repeat: bool = False) -> None:
        self.flags, self.dest, self.help, self.metavar, self.convert = flags, dest, help, metavar, convert
        self.optional_value = optional_value  # a flag that may carry a value, only as --flag=VALUE
        self.repeat = repeat  # may be given several times; the values form a tuple

    @property
    def takes_value(self) -> bool:
        return self.metavar is not None


RUN_OPTIONS = (
    Option(("--config",), "config", "configuration file (see docs/configuration.md)", "PATH"),
    Option(("-m", "--memory-cap"), "memory_cap", "the job's memory cap, e.g. 4G "
           "(default: the host's default_cap)", "SIZE", cap_size),
    Option(("-l", "--label"), "label", "name for the peak table (default: a fingerprint of CMD)",
           "LABEL", job_label),
    Option(("--max-runtime",), "max_runtime", "stop the job after DUR (e.g. 30m) and exit 253", "DUR",
           positive_duration),
    Option(("--threads",), "threads", "heavy-thread count handed to the job (overrides variables "
           "already set)", "N", thread_count),
    Option(("--result-file",), "result_file", "write the outcome as JSON to PATH", "PATH"),
    Option(("--no-cap",), "no_cap", "run even when no memory-cap backend works here (uncapped!)"),
    Option(("--session",), "session", "who is running this (default: $HOSTRUN_SESSION)", "NAME",
           checked_name("--session")),
    Option(("--gpu-memory",), "gpu_memory", "book SIZE of VRAM on one GPU (e.g. 8G; 'auto': a quarter "
           "over the label's worst recorded VRAM, else default_gpu_memory); the job gets that GPU in "
           "CUDA_VISIBLE_DEVICES, and a GPU out-of-memory exits 245", "SIZE", gpu_size),
    Option(("--auto",), "auto", "run where the dispatcher decides (see 'hostrun dispatch')"),
    Option(("--peer",), "peer", "run on a peer: --peer takes the first configured, --peer=NAME that one",
           optional_value=True),
    Option(("--host",), "host", "run on the configured host NAME: a peer or a cluster (as --peer=NAME), "
           "or local", "NAME"),
    Option(("--expect-duration",), "expect_duration", "how long the job is expected to run, for the "
           "long-job rule (default: its recorded durations)", "DUR", duration),
    Option(("--long-job",), "long_job", "declare the job long, exempt from the long-job rule: "
           "--long-job='sharded=HOW;resumable=HOW;multi-host=HOW' or --long-job=@FILE (all three; "
           "'# long-job: KEY: HOW' header lines in the script say the same)", optional_value=True),
    Option(("--long-job-rule",), "long_job_rule", "apply the long-job rule to a run here too: refuse "
           "(244) a job recorded or declared longer than long_job_threshold unless declared long "
           "(--auto always applies it; the agent hooks and shims add this)"),
    Option(("--tree",), "tree", "with --peer: the tree to sync (default: the git top level, else the "
           "current directory)", "DIR"),
    Option(("--return",), "returns", "with --peer: bring PATH (relative to the job's directory) back "
           "after the run, even after a failure (repeatable)", "PATH", repeat=True),
    Option(("--stdin",), "stdin", "with --peer: forward this terminal's/pipe's stdin to the job"),
    Option(("--force",), "force", "run a script whose '# admission:' says nothing changed since its "
           "last success (never overrides a '# run-condition:'; see 'hostrun preflight')"),
    Option(("--group",), "group", "count the job in group NAME: at most groups.NAME.max_running of "
           "them run at once on a host", "NAME", checked_name("--group")),
    Option(("--when-idle",), "when_idle", "start only while no other hostrun job runs on the host "
           "(low-priority background work; may wait long on a busy machine)"),
    Option(("--requeue",), "requeue", "if the job is killed because the slice filled (254), run it "
           "again at its cap instead of failing; a first run may then be booked below its cap (only "
           "for jobs that are safe to run twice)"),
)
_BY_FLAG = {flag: opt for opt in RUN_OPTIONS for flag in opt.flags}


def parse_run_options(options: Sequence[str]) -> RunOptions:
    """The run options, parsed without argparse; options not given keep ``RunOptions``' defaults.

    Accepts ``--flag VALUE``, ``--flag=VALUE`` and ``-mVALUE``; errors read like argparse's.
    """
    values: dict[str, Any] = {}
    i = 0
    while i < len(options):
        arg = options[i]
        i += 1
        name, inline = arg, None
        if arg.startswith("--") and "=" in arg:
            name, inline = arg.split("=", 1)
        elif arg[:2] in _BY_FLAG and len(arg) > 2 and not arg.startswith("--"):
            name, inline = arg[:2], arg[3:] if arg[2] == "=" else arg[2:]
        opt = _BY_FLAG.get(name)
        if opt is None:
            hint = ""
            if i >= 2 and options[i - 2] == "--peer" and not arg.startswith("-"):
                hint = f"; --peer takes a name only as --peer={arg}"  # the one option that does so
            raise UsageError(f"unrecognized arguments: {arg}{hint} (see '{PROG} --help')")
        shown = "/".join(opt.flags)
        if not opt.takes_value:
            if inline is not None and not opt.optional_value:
                raise UsageError(f"argument {shown}: ignored explicit argument {inline!r}")
            values[opt.dest] = inline if inline is not None else True
            continue
        if inline is None:
            if i >= len(options):
                raise UsageError(f"argument {shown}: expected one argument")
            inline = options[i]
            i += 1
        try:
            value = opt.convert(inline)
        except ValueError as exc:
            raise UsageError(f"argument {shown}: {exc}") from None
        values[opt.dest] = (*values.get(opt.dest, ()), value) if opt.repeat else value
    return RunOptions(**values)


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, command after. Without ``--``, the first non-option starts CMD."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            return argv[:i], argv[i:]
        opt = _BY_FLAG.get(arg)
        i += 2 if opt is not None and opt.takes_value else 1
    return argv, []
