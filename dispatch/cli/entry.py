"""The ``hostrun`` console script and ``python -m dispatch``.

``hostrun hook EVENT`` runs before and after every tool call of a coding agent, so it goes straight to
``dispatch.hooks.claude`` without loading the rest of the command line (``dispatch.cli.main``); every
other command goes to ``dispatch.cli.main.main``.
"""

from __future__ import annotations

import gc
import os
import sys

# Start-up allocates tens of thousands of long-lived objects (modules, functions, classes): at the
# default threshold (700) the collector runs over them again and again, ~1 ms of every call
# (measured: bench/bench_startup.py). Collections stay on, only rarer.
gc.set_threshold(50_000, 20, 20)

MYPY = False
if MYPY:
    from typing import NoReturn

SIGPIPE_EXIT = 128 + 13  # as a shell says a process killed by SIGPIPE ended (docs/exit-codes.md)


def entry() -> NoReturn:
    """Like ``sys.exit(main())``, minus the interpreter's teardown: everything hostrun owns is closed
    and released before ``main`` returns; skipping the module teardown only saves the few
    milliseconds every short ``hostrun`` call would otherwise spend."""
    args = sys.argv[1:]
    if args[:1] == ["hook"]:
        from dispatch.hooks import hook_main

        code = hook_main(args[1:])
    else:
        from dispatch.cli.main import main

        try:
            code = main()
        except BrokenPipeError:  # the reader of hostrun's own output went (``hostrun codes | head``)
            code = SIGPIPE_EXIT
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error after
            except (OSError, ValueError):
                pass
    leave(code)


def leave(code: int) -> NoReturn:
    """Flush what was printed and exit with ``code`` at once (the shims end a hostrun run so too)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    os._exit(code)
