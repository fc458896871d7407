"""``hostrun top``: every configured host, its agent sessions and running jobs, the queue, the last
outcomes here and the alerts, live and full-screen (docs/cli.md, "hostrun top"); ``--once``: one
frame as text.

The hosts are read in background threads (``dispatch.placement.hostwatch``), so a frame is drawn
about every ``--interval`` seconds, or at once on a key or a resize, whatever a slow host does.
"""

from __future__ import annotations

import os
import sys
import time

from dispatch.cli.common import check_hosts, load_config, option_value, plain_args, sub_parser
from dispatch.core import UsageError, interrupted

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.cli.topkeys import KeyState
    from dispatch.core import Line
    from dispatch.placement import HostWatch, TopFrame


SOON = 3.0  # seconds from the start in which a frame is redrawn as soon as a first reading comes


def interval_seconds(text: str) -> float:
    """``--interval``: seconds (``0.5``, ``2``) or a duration (``2s``), from 0.1 s to an hour."""
    from dispatch.core import parse_duration

    try:
        value = float(text)
    except ValueError:
        value = parse_duration(text)
    if not 0.1 <= value <= 3600:
        raise ValueError(f"must be between 0.1 and 3600 seconds: {text}")
    return value


def _ellipsis() -> str:
    """"…" where the output is UTF-8, else "~" (a terminal that cannot show it)."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    return "…" if encoding == "utf8" else "~"


def cmd_top(argv: list[str]) -> int:
    # the exact long forms without argparse (~7 ms), as ``report`` does; anything else: argparse
    args: Any = plain_args(argv, switches=("once",), repeated=("host",), single=("config", "interval"))
    if args is None:
        p = sub_parser("top", "A live view of every configured host: memory, slice, load, GPUs; the "
                              "agent sessions, the running jobs, the queue, the last outcomes here "
                              "and the alerts. Keys: q quits, s sorts, / filters, h helps. See "
                              "docs/cli.md.", json_flag=False)
        p.add_argument("--once", action="store_true", help="print one frame as text and exit (no "
                                                           "colours unless stdout is a terminal)")
        p.add_argument("--interval", metavar="SECONDS", help="refresh every SECONDS (default: 1)")
        p.add_argument("--host", action="append", metavar="NAME", help="only this host (repeatable)")
        args = p.parse_args(argv)
    interval = option_value("--interval", args.interval or "1", interval_seconds)
    settings = load_config(args.config)
    check_hosts(settings, args.host)
    from dispatch.placement import HostWatch

    watch = HostWatch(settings, interval, args.host)
    if args.once:
        return _once(watch)
    if not (os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())):
        raise UsageError("top: needs a terminal on stdin and stdout ('hostrun top --once' prints "
                         "one frame as text)")
    return _live(watch)


def _lines(frame: TopFrame, keys: KeyState | None, size: tuple[int, int] | None) -> list[Line]:
    from dispatch.cli.toplayout import layout

    if size is None or keys is None:
        from dispatch.cli.common import terminal_columns

        return layout(frame, terminal_columns(), None, ellipsis=_ellipsis())
    return layout(frame, size[0], size[1], keys.help, keys.typing, _ellipsis())


def _once(watch: HostWatch) -> int:
    """One frame: every host read once within the deadline, then printed."""
    from dispatch.placement import build, read_reports

    readings = read_reports(watch.settings, watch.names)
    now = time.time()
    runs, alerts, notes = watch.history_and_alerts()
    frame = build(readings, {r.host: now for r in readings if r.ok}, runs, alerts,
                  watch.alerts_title(), now, notes=notes)
    lines = _lines(frame, None, None)
    if sys.stdout.isatty():
        from dispatch.cli import render

        render.top_print(lines)
    else:
        from dispatch.cli.toplayout import plain

        sys.stdout.write(plain(lines))
    return 0


def _size() -> tuple[int, int]:
    size = os.get_terminal_size(sys.stdout.fileno())
    return max(1, size.columns), max(1, size.lines)


def _live(watch: HostWatch) -> int:
    """Draw, wait for a key, a resize, a stop or the next interval, draw again; the terminal is put
    back (alternate screen left, cursor shown, echo on) on ``q``, Ctrl-C, SIGTERM or a hang-up."""
    from dispatch.cli import render
    from dispatch.cli.topkeys import KeyState, Terminal
    from dispatch.placement import build

    keys = KeyState()
    terminal = Terminal(sys.stdin.fileno())
    try:
        watch.start()
        with render.TopScreen() as screen:
            began, due = time.monotonic(), 0.0
            while not keys.quit and terminal.stopped is None:
                if terminal.resized or time.monotonic() >= due:
                    terminal.resized = False
                    readings, read_at = watch.readings()
                    runs, alerts, notes = watch.here()
                    frame = build(readings, read_at, runs, alerts, watch.alerts_title(), time.time(),
                                  keys.sort, keys.filter, notes)
                    size = _size()
                    screen.draw(_lines(frame, keys, size), size)
                    # in the first seconds, until every host has answered once, look again soon
                    soon = time.monotonic() - began < SOON and not watch.answered()
                    due = time.monotonic() + (0.1 if soon else watch.interval)
                data = terminal.wait(due - time.monotonic())
                if data:
                    keys.feed(data)
                    due = 0.0  # redraw at once
    finally:
        watch.stop()
        terminal.close()
    stopped = terminal.stopped
    return interrupted(stopped) if stopped is not None else 0
