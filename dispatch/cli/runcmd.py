"""``hostrun [OPTIONS] -- CMD`` (and ``hostrun run``), ``hostrun dispatch``: parse the run options
(``dispatch.core.runoptions``), apply what the label's record decides, run here, on a peer or where
the dispatcher says, and turn the outcome into the exit code and ``--result-file``."""

from __future__ import annotations

import os

from dispatch import __version__
from dispatch.cli.common import SUBCOMMANDS, USAGE, argparser, load_config, say
from dispatch.core import (
    GPU_AUTO,
    LOCAL,
    PROG,
    RUN_OPTIONS,
    ExitCode,
    HostrunError,
    LongJobError,
    RunOptions,
    UsageError,
    outcome_name,
    parse_run_options,
    resolve_session,
    split_command,
)

MYPY = False
if MYPY:
    from collections.abc import Callable
    from typing import Any

    from dispatch.core import Outcome, RunRequest
    from dispatch.hosts import Job


def print_run_help() -> None:
    p = argparser(PROG, "Run CMD under a memory cap, booked in this host's shared ledger. "
                        f"Subcommands: {', '.join(SUBCOMMANDS[1:])} (each has --help).")
    p.usage = USAGE
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    for opt in RUN_OPTIONS:
        if opt.takes_value:
            p.add_argument(*opt.flags, dest=opt.dest, metavar=opt.metavar, help=opt.help,
                           action="append" if opt.repeat else "store")
        elif opt.optional_value:
            p.add_argument(*opt.flags, dest=opt.dest, nargs="?", help=opt.help,
                           metavar="SPEC" if opt.dest == "long_job" else "NAME")
        else:
            p.add_argument(*opt.flags, dest=opt.dest, action="store_true", help=opt.help)
    p.print_help()


def cmd_run(argv: list[str]) -> int:
    from dispatch.core import RunRequest, enclosing_job

    options, command = split_command(argv)
    if "-h" in options or "--help" in options:
        print_run_help()
        return 0
    if "--version" in options:
        print(f"{PROG} {__version__}")
        return 0
    opts = parse_run_options(options)
    if not command:
        raise UsageError(f"no command given (usage: {PROG} [OPTIONS] -- CMD [ARGS...])")
    if opts.host is not None:
        if opts.peer or opts.auto:
            raise UsageError("--host NAME says where the job runs: not with --peer or --auto")
        if opts.host != LOCAL:  # any other configured host is run on as --peer=NAME does
            opts = opts._replace(peer=opts.host)
    if (opts.tree or opts.returns or opts.stdin) and not (opts.peer or opts.auto):
        raise UsageError("--tree, --return and --stdin go with --peer or --auto")
    request = RunRequest(
        argv=command, label=opts.label, cap=opts.memory_cap, max_runtime=opts.max_runtime,
        threads=opts.threads, no_cap=opts.no_cap, session=resolve_session(opts.session),
        gpu_memory=opts.gpu_memory if isinstance(opts.gpu_memory, int) else None,
        force=opts.force, group=opts.group, when_idle=opts.when_idle, requeue=opts.requeue,
    )
    if opts.result_file:
        from dispatch.core import check_result_path

        problem = check_result_path(opts.result_file)
        if problem is not None:  # before anything runs: the caller would lose the outcome
            raise UsageError(f"--result-file {opts.result_file}: cannot write there: {problem}")
    enclosing = enclosing_job(os.environ)
    try:
        long_rule = opts.long_job_rule and not opts.auto and enclosing is None  # --auto: its own
        if opts.gpu_memory == GPU_AUTO or long_rule:
            opts = _label_rules(command, opts, long_rule)
            request = request._replace(gpu_memory=_gpu_bytes(opts))
        if enclosing is not None:
            from dispatch.local import run_inside

            outcome = run_inside(request, enclosing, keep_outcome=bool(opts.result_file),
                                 settings=lambda: load_config(opts.config), say=say)
        elif opts.peer or opts.auto:
            return _run_elsewhere(options, command, opts, request)
        else:  # the door of every run: its host's ``run``, here this machine's
            from dispatch.hosts import LocalHost, RunExtras

            settings = load_config(opts.config)
            extras = RunExtras(watch=_peer_watch(settings, options, command, opts),
                               park=_own_command_line(argv))
            outcome = LocalHost(settings, settings.local).run(request, say, extras)
    except HostrunError as exc:
        if opts.result_file:
            write_failure(opts.result_file, request, exc)
        raise
    return finish(outcome, opts.result_file)


def _own_command_line(argv: list[str]) -> bool:
    """Whether ``argv`` ends this process's own command line (``hostrun [OPTIONS] -- CMD``, not a
    shim's or a library caller's), so that running that line again resumes this run: a waiting run
    may then park (``dispatch.local.engine.park``)."""
    import sys

    own = list(getattr(sys, "orig_argv", None) or [])
    return bool(argv) and own[-len(argv):] == argv and sys.argv[-len(argv):] == argv


def _gpu_bytes(opts: RunOptions) -> int | None:
    assert not isinstance(opts.gpu_memory, str), "--gpu-memory auto is resolved first (_label_rules)"
    return opts.gpu_memory


def _label_rules(command: list[str], opts: RunOptions, long_rule: bool) -> RunOptions:
    """What the label's record here decides before the run: ``--gpu-memory auto``'s size (said in
    one line), and with ``long_rule`` the long-job rule's refusal (LongJobError, 244). A run nested
    in a job is not refused: the job around it was admitted as it is."""
    from dispatch.core import storable
    from dispatch.local import default_label
    from dispatch.placement import labelrules

    settings = load_config(opts.config)
    record = labelrules.record_here(settings, storable(opts.label or default_label(command)))
    if opts.gpu_memory == GPU_AUTO:
        size, why = labelrules.gpu_memory_auto(settings, record)
        say(why)
        opts = opts._replace(gpu_memory=size)
    if long_rule:
        refused = labelrules.long_job_here(settings, _job(command, opts), record)
        if refused is not None:
            raise LongJobError("; ".join(refused))
    return opts


def _peer_watch(settings: Any, options: list[str], command: list[str], opts: RunOptions
                ) -> Callable[[Any], None] | None:
    """While a local job waits, alert once if a peer could take it (only with peers enabled)."""
    if not settings.enable_across_machines or len(settings.hosts) < 2:
        return None  # the common case: no import of the dispatcher on the hot path
    from dispatch.placement import PeerWatch

    return PeerWatch(settings, _job(command, opts), options, command, say,
                     session=resolve_session(opts.session))


def _job(command: list[str], opts: RunOptions) -> Job:
    from dispatch.placement import make_job

    return make_job(command, label=opts.label, cap=opts.memory_cap,
                    gpu_memory=_gpu_bytes(opts), expect_duration=opts.expect_duration,
                    long_job=opts.long_job, threads=opts.threads)


def _run_elsewhere(options: list[str], command: list[str], opts: RunOptions,
                   request: RunRequest) -> int:
    """``--auto`` (run where the dispatcher decides) and ``--peer``: the library places, we run."""
    from dispatch.placement import forget_sent, place_on_peer

    settings = load_config(opts.config)
    if opts.peer:
        from dispatch.local import default_label

        placed = place_on_peer(settings, opts.peer, request.label or default_label(command),
                               opts.memory_cap, _gpu_bytes(opts), by_host=opts.host is not None)
    else:
        from dispatch.placement import place

        placed = place(settings, _job(command, opts))
        for reason in placed.reasons:
            say(f"dispatch: {reason}")
        if placed.refused is not None:
            code = ExitCode(placed.refused)
            say(f"exit {code.value} ({code.outcome}): {code.meaning}")
            return code.value
    from dispatch.hosts import RunExtras

    host = placed.host
    assert host is not None
    try:
        watch = _peer_watch(settings, options, command, opts) if host.is_here else None
        return finish(host.run(request, say, RunExtras(tree=opts.tree, returns=opts.returns,
                                                        stdin=opts.stdin, watch=watch)), opts.result_file)
    finally:
        forget_sent(settings, placed.note)


def finish(outcome: Outcome, result_file: str | None) -> int:
    """Say what happened, write the result file, and return the exit code."""
    if outcome.message:
        say(outcome.message)
    if outcome.outcome not in ("exit", "signal"):  # hostrun's own verdict, not the job's status
        try:
            code = ExitCode(outcome.exit_code)
            say(f"exit {code.value} ({code.outcome}): {code.meaning}")
        except ValueError:
            pass
    if result_file:
        from dispatch.core import write_result

        try:
            write_result(result_file, outcome)
        except OSError as exc:  # the job's own exit status still stands
            say(f"warning: could not write the result file {result_file}: {exc.strerror}")
    return outcome.exit_code


def write_failure(path: str, request: RunRequest, exc: HostrunError) -> None:
    """A caller never has to guess from a number: hostrun's own refusals get a result file too."""
    from dispatch.core import Outcome, write_result
    from dispatch.local import default_label

    argv = list(request.argv)
    try:
        write_result(path, Outcome(
            exit_code=int(exc.exit_code), outcome=outcome_name(exc.exit_code), host=exc.host or "local",
            label=request.label or default_label(argv), argv=argv, message=str(exc),
        ))
    except OSError as error:
        say(f"warning: could not write the result file {path}: {error.strerror}")


def cmd_dispatch(argv: list[str]) -> int:
    """Print where a job would run, and why, without running it."""
    options, command = split_command(argv)
    json_out = "--json" in options
    options = [o for o in options if o != "--json"]
    if "-h" in options or "--help" in options:
        print(f"usage: {PROG} dispatch [--json] [RUN OPTIONS] -- CMD [ARGS...]\n\n"
              "Print where CMD would run and why (the dispatcher's rules), without running it.")
        return 0
    opts = parse_run_options(options)
    if not command:
        raise UsageError(f"no command given (usage: {PROG} dispatch [--json] [OPTIONS] -- CMD)")
    from dispatch.placement import consider

    if opts.gpu_memory == GPU_AUTO:
        opts = _label_rules(command, opts, long_rule=False)
    decision = consider(load_config(opts.config), _job(command, opts))
    if json_out:
        import json

        print(json.dumps(decision.as_dict(), indent=2))
    else:
        from dispatch.cli import render

        render.decision(decision)
    return 0 if decision.action != "refuse" else int(decision.exit_code)
