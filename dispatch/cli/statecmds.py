"""The commands that show state: ``codes``, ``ledger``, ``history``, ``report``, ``capacity``,
``doctor``."""

from __future__ import annotations

from dispatch.cli.common import (
    check_hosts,
    history_limit,
    load_config,
    option_value,
    plain_args,
    readings_status,
    say,
    sub_parser,
)
from dispatch.core import ExitCode, cap_size

MYPY = False
if MYPY:
    from collections.abc import Mapping
    from typing import Any


def cmd_codes(argv: list[str]) -> int:
    args = sub_parser("codes", "Print hostrun's exit-code table.").parse_args(argv)
    rows = [(c.value, c.outcome, c.meaning) for c in ExitCode]
    if args.json:
        import json

        print(json.dumps([{"code": c, "name": n, "meaning": m} for c, n, m in rows], indent=2))
        return 0
    from dispatch.cli import render

    render.codes(rows)
    return 0


def cmd_ledger(argv: list[str]) -> int:
    args = sub_parser("ledger", "Show running jobs, the queue and the peak table.").parse_args(argv)
    from dispatch.local import Ledger, live_jobs_of, mark_reasons, outside_the_slice

    settings = load_config(args.config)
    ledger = Ledger(settings.state_dir, say, live_jobs_of(settings))
    try:
        bookings, peaks = ledger.bookings(), ledger.peaks()
    finally:
        ledger.close()
    from dispatch.core import is_alive

    # Read only: a booking whose holder is gone is shown as stale; the next admission reclaims it.
    stale = {b.id for b in bookings if not is_alive(b.pid, b.pid_start)}
    invalid = outside_the_slice(settings, bookings)
    if args.json:
        import json

        from dispatch.local import time_to_peak

        def row(b: Any) -> dict[str, Any]:
            return {**b._asdict(), "stale": b.id in stale,
                    "invalid": INVALID_CGROUP if b.id in invalid else None}

        print(json.dumps({
            "running": [row(b) for b in bookings if b.state == "running"],
            "queue": [row(b) for b in bookings if b.state == "waiting"],
            "peaks": [{**p._asdict(), "time_to_peak": time_to_peak(p.ramp),
                       "clear_mark_after": settings.clear_mark_after,
                       "marked_because": mark_reasons(p, settings.clear_mark_after)} for p in peaks],
        }, indent=2))
        return 0
    from dispatch.cli import render

    render.ledger(bookings, peaks, stale, invalid, settings.clear_mark_after)
    return 0


INVALID_CGROUP = "cgroup outside the slice"


def cmd_history(argv: list[str]) -> int:
    p = sub_parser("history", "Finished runs from this host's ledger, oldest first: start, end, "
                              "duration, host, label, session, command, cap, booking, peak, exit "
                              "code and outcome, hit-ceiling. See docs/cli.md.")
    p.add_argument("--label", metavar="LABEL", help="only runs with this label")
    p.add_argument("--host", metavar="NAME", help="only runs on this host (local, or a peer's name)")
    p.add_argument("--session", metavar="NAME", help="only runs of this session")
    p.add_argument("--since", metavar="T", help="only runs that ended since T: a duration ago (2h, "
                                                "7d) or an ISO date/time (2024-05-01T14:30)")
    p.add_argument("--limit", metavar="N", default="50",
                   help="only the latest N runs (default: %(default)s; 0: all)")
    args = p.parse_args(argv)
    from dispatch.local import since_time

    since = None if args.since is None else option_value("--since", args.since, since_time)
    limit = option_value("--limit", args.limit, history_limit)
    from dispatch.local import Ledger, live_jobs_of

    settings = load_config(args.config)
    ledger = Ledger(settings.state_dir, say, live_jobs_of(settings))
    try:
        runs = ledger.runs(label=args.label, host=args.host, session=args.session, since=since,
                           limit=limit)
    finally:
        ledger.close()
    if args.json:
        import json

        from dispatch.local import as_dict

        print(json.dumps([as_dict(r) for r in runs], indent=2))
        return 0
    from dispatch.cli import render

    render.history(runs)
    return 0


def cmd_report(argv: list[str]) -> int:
    args: Any = plain_args(argv, switches=("json",), repeated=("host",))
    if args is None:
        p = sub_parser("report", "Every configured host's memory, slice, bookings, load, GPUs and "
                                 "queue, read in parallel within the configured deadlines.")
        p.add_argument("--host", action="append", metavar="NAME", help="only this host (repeatable)")
        args = p.parse_args(argv)
    from dispatch.placement import read_reports

    settings = load_config(args.config)
    check_hosts(settings, args.host)
    readings = read_reports(settings, args.host)
    here = [r.report for r in readings if r.report is not None and r.source is not None
            and r.source.is_here]
    if here:  # this host's engine; a peer's would be its agent's to say
        from dispatch.hosts import machine_report
        from dispatch.local import admission_engine

        machine_report(here[0])["admission_engine"] = admission_engine(settings)
    if args.json:
        import json

        print(json.dumps({"hosts": [
            {"host": r.host, "ok": r.ok, "error": r.error, "elapsed_s": round(r.elapsed, 3),
             "report": r.report} for r in readings]}, indent=2))
    else:
        from dispatch.cli import render

        render.readings(readings)
    return readings_status(settings, readings)


def cmd_capacity(argv: list[str]) -> int:
    p = sub_parser("capacity", "For each label in each host's own peak table: how many fit on that "
                               "host at once, the cap it should have by the half rule (worst peak <= "
                               "half the cap, rounded up to 512 MiB), and flags. See docs/capacity.md.")
    p.add_argument("--host", action="append", metavar="NAME", help="only this host (repeatable)")
    p.add_argument("--slice", metavar="SIZE", help="also show how many would fit if each host's slice "
                                                   "were SIZE (e.g. 40G)")
    p.add_argument("--sessions", action="store_true",
                   help="agent sessions instead of jobs: for each session label (session:NAME), the "
                        "cap by the half rule and how many fit in the host's sessions slice")
    args = p.parse_args(argv)
    what_if = None if args.slice is None else option_value("--slice", args.slice, cap_size)
    from dispatch.placement import read_reports

    settings = load_config(args.config)
    check_hosts(settings, args.host)
    readings = read_reports(settings, args.host, peaks=True)
    if args.sessions:
        from dispatch.local import host_sessions, session_rules

        hosts: list[Any] = [host_sessions(r.host, r.report, r.error, what_if) for r in readings]
        rules: Mapping[str, object] = session_rules()
    else:
        from dispatch.local import host_capacity, job_rules

        hosts = [host_capacity(r.host, r.report, r.error, what_if) for r in readings]
        rules = job_rules()
    if args.json:
        import json

        print(json.dumps({"what_if_slice": what_if, "rules": rules,
                          "hosts": [h.as_dict() for h in hosts]}, indent=2))
    else:
        from dispatch.cli import render

        (render.sessions if args.sessions else render.capacity)(hosts)
    return readings_status(settings, readings)


def cmd_doctor(argv: list[str]) -> int:
    args = sub_parser("doctor", "Which memory-cap backend is active, and why the others are not.",
                      ).parse_args(argv)
    from dispatch.cli.doctor import diagnose, diagnose_peers

    settings = load_config(args.config)
    data = diagnose(settings)
    data["peers"] = diagnose_peers(settings)
    if args.json:
        import json

        print(json.dumps(data, indent=2))
        return 0
    from dispatch.cli import render

    render.doctor(data)
    return 0
