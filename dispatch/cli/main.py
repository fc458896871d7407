"""The ``hostrun`` command: pick the subcommand, run its handler, turn an error into its line and
exit code. Nothing else lives here.

Each subcommand is a ``cmd_*`` function in a module of its kind (``runcmd``: a run and ``dispatch``;
``statecmds``; ``alertcmds``; ``guardcmds``; ``setupcmds``; ``topcmd``; ``completion``), found through
the one registry ``dispatch.cli.common.COMMANDS`` and imported only when it runs. Each parses
its arguments, calls the library, renders, and returns its exit code.

Errors raised by the library are translated to one ``hostrun: error: …`` line and their exit code
here, once. Heavy imports (pydantic via config validation, rich via ``dispatch.cli.render``) happen only
on the paths that need them.
"""

from __future__ import annotations

import sys

from dispatch.cli.common import COMMANDS
from dispatch.core import PROG, ExitCode, HostrunError, interrupted

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence


def command(name: str) -> Callable[[list[str]], int]:
    """The handler of subcommand ``name`` (``dispatch.cli.common.COMMANDS``), its module imported now."""
    module, function = COMMANDS[name]
    path = f"dispatch.cli.{module}"
    __import__(path)  # not importlib.import_module: the importlib package loads warnings (hot path)
    handler: Callable[[list[str]], int] = getattr(sys.modules[path], function)
    return handler


def error_line(exc: HostrunError, name: str) -> str:
    """The one line an error is said as (``hostrun: error: …``, or the error's own ``prefix``). A
    usage error proper (a bad command line or input, not a configuration or trust refusal, which
    name their own fix) ends with where help is, once, for every command: ``(see 'hostrun lock
    --help')``."""
    from dispatch.core import UsageError, printable

    message = printable(str(exc))
    if type(exc) is UsageError and not message.endswith("--help')"):
        where = PROG if name == "run" else f"{PROG} {name}"
        message = f"{message} (see '{where} --help')"
    return f"{PROG}: {exc.prefix}: {message}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    name = "run"
    try:
        if args and args[0] in ("-h", "--help"):
            from dispatch.cli.runcmd import print_run_help

            print_run_help()
            return 0
        leading: list[str] = []  # "hostrun --config X ledger" as well as "hostrun ledger --config X"
        while args and (args[0] == "--config" or args[0].startswith("--config=")):
            take = 2 if args[0] == "--config" else 1
            leading, args = leading + args[:take], args[take:]
        name = args[0] if args and args[0] in COMMANDS else "run"
        if name == "run" and args[:1] != ["run"]:
            rest = leading + args  # "hostrun [OPTIONS] -- CMD"
        elif name in ("run", "dispatch", "lock", "preflight", "session"):
            rest = leading + args[1:]  # run-style commands end in "-- CMD": options come before it
        else:
            rest = args[1:] + leading
        return command(name)(rest)
    except HostrunError as exc:
        print(error_line(exc, name), file=sys.stderr)
        return int(exc.exit_code)
    except OSError as exc:
        import errno

        from dispatch.core import printable

        if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ENOSPC):
            raise
        # A resource limit (fds, pids, memory, space) is the host's state, not a bug: one line, 78.
        print(f"{PROG}: error: {printable(str(exc))} (a limit on open files, processes, "
              "memory or disk space stopped hostrun; nothing is left booked)", file=sys.stderr)
        return int(ExitCode.NOT_RUN)
    except KeyboardInterrupt:
        import signal

        return interrupted(signal.SIGINT)
    except BrokenPipeError:
        import signal

        return interrupted(signal.SIGPIPE)
