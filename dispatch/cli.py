"""The ``hostrun`` command: parse, call the library, render, exit. Nothing else lives here.

Errors raised by the library are translated to one ``hostrun: error: …`` line and their exit code
here, once. Heavy imports (pydantic via config validation, rich via ``dispatch.render``) happen only
on the paths that need them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from dispatch import __version__
from dispatch.errors import HostrunError, UsageError
from dispatch.exitcodes import ExitCode

SUBCOMMANDS = ("run", "doctor", "codes", "ledger", "report")
PROG = "hostrun"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 (ExitCode.USAGE)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{PROG} --help')")


def _say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _size(text: str) -> int:
    from dispatch.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    from dispatch.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _run_parser() -> _Parser:
    p = _Parser(
        prog=PROG,
        usage=f"{PROG} [RUN OPTIONS] -- CMD [ARGS...]\n       {PROG} {{doctor,codes,ledger,report}} ...",
        description="Run CMD under a memory cap, booked in this host's shared ledger. "
        "Subcommands: doctor, codes, ledger, report (each has --help).",
    )
    p.add_argument("--config", metavar="PATH", help="configuration file (see docs/configuration.md)")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument("-m", "--memory-cap", type=_size, metavar="SIZE",
                   help="the job's memory cap, e.g. 4G (default: the host's default_cap)")
    p.add_argument("-l", "--label", help="name for the peak table (default: a fingerprint of CMD)")
    p.add_argument("--max-runtime", type=_duration, metavar="DUR",
                   help="stop the job after DUR (e.g. 30m) and exit 253")
    p.add_argument("--threads", type=_positive_int, metavar="N",
                   help="heavy-thread count handed to the job (overrides set variables)")
    p.add_argument("--result-file", metavar="PATH", help="write the outcome as JSON to PATH")
    p.add_argument("--no-cap", action="store_true",
                   help="run even when no memory-cap backend works here (uncapped!)")
    p.add_argument("--session", help="who is running this (default: $HOSTRUN_SESSION)")
    return p


def _sub_parser(name: str, help_text: str, json_flag: bool = True) -> _Parser:
    p = _Parser(prog=f"{PROG} {name}", description=help_text)
    p.add_argument("--config", metavar="PATH", help="configuration file")
    if json_flag:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _settings(config: str | None):  # type: ignore[no-untyped-def]
    from dispatch.config import load_settings

    return load_settings(config)


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, command after. Without ``--``, the first non-option starts CMD."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    takes_value = {"--config", "-m", "--memory-cap", "-l", "--label", "--max-runtime", "--threads",
                   "--result-file", "--session"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            return argv[:i], argv[i:]
        i += 2 if arg in takes_value else 1
    return argv, []


def cmd_run(argv: list[str]) -> int:
    from dispatch.runner import RunRequest, run_local

    options, command = _split_command(argv)
    args = _run_parser().parse_args(options)
    if not command:
        raise UsageError(f"no command given (usage: {PROG} [OPTIONS] -- CMD [ARGS...])")
    settings = _settings(args.config)
    request = RunRequest(
        argv=command, label=args.label, cap=args.memory_cap, max_runtime=args.max_runtime,
        threads=args.threads, no_cap=args.no_cap,
        session=args.session or os.environ.get("HOSTRUN_SESSION"),
    )
    outcome = run_local(settings, request, _say)
    if outcome.message:
        _say(outcome.message)
    if outcome.exit_code in (ExitCode.OWN_CAP, ExitCode.SLICE_FULL, ExitCode.MAX_RUNTIME):
        code = ExitCode(outcome.exit_code)
        _say(f"exit {code.value} ({code.outcome}): {code.meaning}")
    if args.result_file:
        from dispatch.outcome import write_result

        write_result(args.result_file, outcome)
    return outcome.exit_code


def cmd_codes(argv: list[str]) -> int:
    args = _sub_parser("codes", "Print hostrun's exit-code table.").parse_args(argv)
    rows = [(c.value, c.outcome, c.meaning) for c in ExitCode]
    if args.json:
        import json

        print(json.dumps([{"code": c, "name": n, "meaning": m} for c, n, m in rows], indent=2))
        return 0
    from dispatch import render

    render.codes(rows)
    return 0


def cmd_ledger(argv: list[str]) -> int:
    args = _sub_parser("ledger", "Show running jobs, the queue and the peak table.").parse_args(argv)
    from dispatch.ledger import Ledger

    settings = _settings(args.config)
    ledger = Ledger(settings.state_dir)
    try:
        bookings, peaks = ledger.bookings(), ledger.peaks()
    finally:
        ledger.close()
    if args.json:
        import json

        print(json.dumps({
            "running": [b._asdict() for b in bookings if b.state == "running"],
            "queue": [b._asdict() for b in bookings if b.state == "waiting"],
            "peaks": [p._asdict() for p in peaks],
        }, indent=2))
        return 0
    from dispatch import render

    render.ledger(bookings, peaks)
    return 0


def cmd_report(argv: list[str]) -> int:
    args = _sub_parser("report", "This host's memory, slice, bookings, load and queue.").parse_args(
        argv
    )
    from dispatch.report import local_report

    data = local_report(_settings(args.config))
    if args.json:
        import json

        print(json.dumps(data, indent=2))
        return 0
    from dispatch import render

    render.report(data)
    return 0


def cmd_doctor(argv: list[str]) -> int:
    args = _sub_parser("doctor", "Which memory-cap backend is active, and why the others are not.",
                       ).parse_args(argv)
    from dispatch.doctor import diagnose

    data = diagnose(_settings(args.config))
    if args.json:
        import json

        print(json.dumps(data, indent=2))
        return 0
    from dispatch import render

    render.doctor(data)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in ("-h", "--help"):
            _run_parser().print_help()
            return 0
        leading: list[str] = []  # "hostrun --config X ledger" as well as "hostrun ledger --config X"
        while args and (args[0] == "--config" or args[0].startswith("--config=")):
            take = 2 if args[0] == "--config" else 1
            leading, args = leading + args[:take], args[take:]
        if args and args[0] in SUBCOMMANDS:
            name, rest = args[0], args[1:] + leading
            if name == "run":
                return cmd_run(rest)
            handler = {"doctor": cmd_doctor, "codes": cmd_codes, "ledger": cmd_ledger,
                       "report": cmd_report}[name]
            return handler(rest)
        return cmd_run(leading + args)
    except HostrunError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141


if __name__ == "__main__":
    sys.exit(main())
