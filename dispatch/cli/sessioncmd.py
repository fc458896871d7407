"""``hostrun session [OPTIONS] -- CMD``: an agent session under the machine's budget
(``dispatch.local.sessions.agentsession``): parse, run, say what happened, exit with its code."""

from __future__ import annotations

import os

from dispatch.cli.common import load_config, option_value, say, sub_parser
from dispatch.core import HostrunError, UsageError, cap_size, split_command


def cmd_session(argv: list[str]) -> int:
    options, command = split_command(argv)
    p = sub_parser("session", "Run an agent session (e.g. claude) in a cgroup of its own in the "
                              "sessions slice: booked like a job (its recorded peaks), capped, held "
                              "back at its high mark; the jobs it starts through hostrun are booked "
                              "beside it. See docs/agents.md, 'Sessions under the budget'.",
                   json_flag=False)
    p.usage = ("hostrun session [--config PATH] [-m SIZE] [--label NAME] [--result-file PATH] "
               "-- CMD [ARGS...]")
    p.add_argument("-m", "--memory-cap", metavar="SIZE",
                   help="the session's cap (default: 2 x its worst recorded peak in 512 MiB steps, "
                        "else [sessions] cap)")
    p.add_argument("--label", metavar="NAME",
                   help="the kind of session its peaks are kept for: session:NAME (default: the program)")
    p.add_argument("--result-file", metavar="PATH", help="write the outcome as JSON there")
    args = p.parse_args(options)
    if not command:
        raise UsageError("no command given (usage: hostrun session [OPTIONS] -- CMD [ARGS...])")
    cap = None if args.memory_cap is None else option_value("-m", args.memory_cap, cap_size)
    label = None
    if args.label is not None:
        from dispatch.core import check_name

        label = option_value("--label", args.label, lambda v: check_name(v, "--label"))
    from dispatch.core import RunRequest, enclosing_job

    request = RunRequest(argv=command, label=label, cap=cap, role="session")
    if enclosing_job(os.environ) is not None:
        raise UsageError("hostrun session inside a hostrun job: a session runs beside jobs, not in one")
    if args.result_file:
        from dispatch.core import check_result_path

        problem = check_result_path(args.result_file)
        if problem is not None:
            raise UsageError(f"--result-file {args.result_file}: cannot write there: {problem}")
    from dispatch.local import run_session

    settings = load_config(args.config)
    try:
        outcome = run_session(settings, request, say)
    except HostrunError as exc:
        if args.result_file:
            from dispatch.cli.runcmd import write_failure

            write_failure(args.result_file, request, exc)
        raise
    from dispatch.cli.runcmd import finish

    return finish(outcome, args.result_file)
