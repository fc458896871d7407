"""``hostrun alerts`` and ``hostrun watch``: the alert log, per session."""

from __future__ import annotations

from dispatch.cli.common import load_config, print_lines, say, sub_parser
from dispatch.core import UsageError, checked_name, resolve_session

MYPY = False
if MYPY:

    from dispatch.core import Alert


def cmd_alerts(argv: list[str]) -> int:
    p = sub_parser("alerts", "List alerts: a job waiting long or that a peer could take now, a job "
                             "killed at its own cap or in a full slice, a peer that could not be "
                             "reached. See docs/agents.md.")
    p.add_argument("--follow", action="store_true", help="wait for new alerts and print each")
    p.add_argument("--session", metavar="NAME", type=checked_name("--session"),
                   help="only alerts for this session (and for every session); with --unread/--ack "
                        "the session whose read cursor moves (default: $HOSTRUN_SESSION)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--unread", action="store_true",
                      help="print this session's alerts not read yet, and mark them read")
    mode.add_argument("--ack", action="store_true",
                      help="mark this session's alerts read without printing them")
    args = p.parse_args(argv)
    from dispatch.placement import alerts

    settings = load_config(args.config)
    path = settings.alerts_path
    if args.unread or args.ack:
        session = resolve_session(args.session)
        if session is None:
            raise UsageError(f"--{'unread' if args.unread else 'ack'} needs a session: pass --session "
                             "NAME or set HOSTRUN_SESSION")
        if args.follow:
            raise UsageError("--follow does not go with --unread or --ack")
        records = alerts.unread(settings, session, mark=True)
        if args.ack:
            return 0
    elif args.follow:
        import json

        for record in alerts.follow(path):
            if not alerts.addressed_to(record, args.session):
                continue
            if args.json:
                print(json.dumps(record), flush=True)
            else:
                print_lines([alert_line(record)])
        return 0
    else:
        records = [r for r in alerts.read_all(path) if alerts.addressed_to(r, args.session)]
    if args.json:
        import json

        print(json.dumps(records, indent=2))
    else:
        print_lines([alerts.describe(record) if args.unread else alert_line(record)
                     for record in records])
    return 0


def cmd_watch(argv: list[str]) -> int:
    p = sub_parser("watch", "Follow the alert file and run CMD for each new alert (its JSON on "
                            "stdin), or print it. One per state directory; SIGTERM/SIGINT end it. "
                            "See docs/agents.md.")
    p.add_argument("--exec", dest="exec_cmd", metavar="CMD",
                   help="run CMD (split like a shell would, run without one) per alert")
    p.add_argument("--session", metavar="NAME", type=checked_name("--session"),
                   help="only alerts for this session (and for every session)")
    args = p.parse_args(argv)
    from dispatch.placement import parse_exec, watch

    exec_argv = parse_exec(args.exec_cmd)
    return watch(load_config(args.config), exec_argv, args.session, args.json, say,
                 lambda line: print(line, flush=True))


def alert_line(record: Alert) -> str:
    import time as _time

    when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(record.get("time", 0)))
    return f"{when} {record.get('kind', '?')}: {record.get('message', '')}"
