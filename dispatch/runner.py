"""Run one job on this host: book it, wait for room, run it capped, judge the outcome, release.

The job runs in its own process group and its own cgroup (entered before exec). hostrun forwards
SIGINT/SIGTERM/SIGHUP/SIGQUIT to the job's process group, then kills the whole cgroup after the grace
period; a second signal kills at once. When the main process exits, whatever it left in the cgroup is
killed too: nothing may run unbooked. A forked guardian does the same if hostrun itself dies.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Optional

from dispatch.admission import stop_reclaimed, wait_for_room
from dispatch.booking import Plan, default_label, plan_booking
from dispatch.capping import select_backend
from dispatch.capping.base import CapBackend, JobCgroup
from dispatch.errors import NoCapBackendError, UsageError
from dispatch.exitcodes import SIGNAL_BASE, ExitCode
from dispatch.guardian import Guardian
from dispatch.hostfacts import read_meminfo
from dispatch.ledger import Ledger
from dispatch.outcome import Outcome
from dispatch.procinfo import start_time
from dispatch.settings import HostSettings, Settings

SAMPLE_INTERVAL = 0.05
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
THREAD_KNOBS = ("CARGO_BUILD_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL")


class RunRequest(NamedTuple):
    argv: Sequence[str]
    label: Optional[str] = None
    cap: Optional[int] = None
    max_runtime: Optional[float] = None
    threads: Optional[int] = None
    no_cap: bool = False
    session: Optional[str] = None
    env: Optional[dict[str, str]] = None  # the job's environment (default: hostrun's own)


def job_environment(base: dict[str, str], threads: int, forced: bool) -> dict[str, str]:
    """The heavy-thread default: set unless already set, or always when ``--threads`` was given."""
    env = dict(base)
    wanted = {"HOSTRUN_THREADS": str(threads), "MAKEFLAGS": f"-j{threads}"}
    wanted.update({knob: str(threads) for knob in THREAD_KNOBS})
    for key, value in wanted.items():
        if forced or key not in env:
            env[key] = value
    return env


class _Signals:
    """Collects forwarded signals while the job runs; restores the old handlers afterwards."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._old: dict[int, object] = {}

    def __enter__(self) -> _Signals:
        for sig in FORWARDED:
            self._old[sig] = signal.signal(sig, lambda signum, _frame: self.pending.append(signum))
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise _Interrupted(signum)


def run_local(settings: Settings, request: RunRequest, say: Callable[[str], None]) -> Outcome:
    """Book, wait, run and judge one job on this host; the Outcome carries the exit code."""
    if not request.argv:
        raise UsageError("no command given (usage: hostrun [OPTIONS] -- CMD [ARGS...])")
    host = settings.local
    mem = read_meminfo()
    backend = select_backend(host, mem.total)
    if not backend.caps_memory and not request.no_cap:
        raise NoCapBackendError(
            "no memory-cap backend works on this host (run 'hostrun doctor' to see why); "
            "pass --no-cap to run uncapped anyway"
        )
    limit = host.slice_limit(mem.total)
    label = request.label or default_label(request.argv)
    cap = request.cap if request.cap is not None else host.default_cap
    ledger = Ledger(settings.state_dir)
    try:
        plan = plan_booking(
            cap=cap, peak=ledger.peak(label, host.name), slice_limit=limit,
            gamble_size=settings.gamble_size_for(host),
        )
        backend.ensure_slice(limit)
        return _book_and_run(settings, host, backend, ledger, request, label, plan, limit, say)
    finally:
        ledger.close()


def _book_and_run(
    settings: Settings, host: HostSettings, backend: CapBackend, ledger: Ledger,
    request: RunRequest, label: str, plan: Plan, limit: int, say: Callable[[str], None],
) -> Outcome:
    me = os.getpid()
    booking_id = ledger.enqueue(
        host=host.name, label=label, pid=me, pid_start=start_time(me) or 0, size=plan.size,
        cap=plan.limit, kind=plan.kind, command=" ".join(request.argv), session=request.session,
    )
    old_term = signal.signal(signal.SIGTERM, _raise_interrupted)
    old_hup = signal.signal(signal.SIGHUP, _raise_interrupted)
    job: JobCgroup | None = None
    guardian: Guardian | None = None
    try:
        try:
            waited = wait_for_room(
                ledger, backend, host.name, booking_id, limit, settings.status_interval, say
            )
            job = backend.create_job(f"{booking_id}-{me}", plan.limit)
            ledger.set_cgroup(booking_id, job.path)
            guardian = Guardian.start(settings.state_dir, booking_id, job)
        except KeyboardInterrupt:
            return _interrupted(host, label, request, signal.SIGINT)
        except _Interrupted as exc:
            return _interrupted(host, label, request, exc.signum)
        finally:
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGHUP, old_hup)
        outcome = _supervise(settings, host, backend, job, request, label, plan, say)
        outcome.waited_s = round(waited, 3)
        if outcome.peak_bytes is not None:
            ledger.record_peak(
                label, host.name, outcome.peak_bytes, outcome.outcome == ExitCode.OWN_CAP.outcome,
                outcome.duration_s,
            )
        return outcome
    finally:
        if job is not None:
            job.kill_all()
            try:
                job.remove()
            except OSError as exc:
                say(f"warning: could not remove {job.path}: {exc.strerror}")
        ledger.release(booking_id)
        if guardian is not None:
            guardian.dismiss()
        stop_reclaimed(backend, ledger.reclaim(host.name))


def _interrupted(host: HostSettings, label: str, request: RunRequest, signum: int) -> Outcome:
    return Outcome(
        exit_code=SIGNAL_BASE + signum, outcome="signal", host=host.name, label=label,
        argv=list(request.argv), message="interrupted while waiting for room; nothing ran",
    )


def _spawn(job: JobCgroup, argv: list[str], env: dict[str, str], adj: int) -> subprocess.Popen[bytes]:
    def enter() -> None:
        os.setpgid(0, 0)
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
            fh.write(str(adj))
        job.preexec()
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)

    return subprocess.Popen(job.wrap_argv(argv), env=env, preexec_fn=enter, close_fds=True)


def _supervise(
    settings: Settings, host: HostSettings, backend: CapBackend, job: JobCgroup,
    request: RunRequest, label: str, plan: Plan, say: Callable[[str], None],
) -> Outcome:
    base_env = dict(os.environ if request.env is None else request.env)
    env = job_environment(base_env, request.threads or host.threads(), request.threads is not None)
    result = Outcome(
        exit_code=0, outcome="exit", host=host.name, label=label, argv=list(request.argv),
        cap_bytes=plan.limit, booking_kind=plan.kind, booked_bytes=plan.size,
        backend=backend.name, cgroup=job.path or None,
    )
    started = time.monotonic()
    with _Signals() as signals:
        try:
            proc = _spawn(job, list(request.argv), env, plan.oom_score_adj)
        except OSError as exc:
            result.exit_code = 126 if isinstance(exc, PermissionError) else 127
            result.message = f"cannot run {request.argv[0]!r}: {exc.strerror}"
            result.duration_s = 0.0
            return result
        job.started(proc.pid)
        peak, timed_out = _watch(settings, job, proc, request.max_runtime, signals, say)
    result.duration_s = round(time.monotonic() - started, 3)
    status = proc.returncode
    job.kill_all()
    verdict = job.verdict()
    result.counters = verdict.counters
    if verdict.own:
        peak = max(peak, job.charged_peak())
    result.peak_bytes = peak
    if timed_out:
        result.exit_code, result.outcome = ExitCode.MAX_RUNTIME, ExitCode.MAX_RUNTIME.outcome
    elif verdict.own and status != 0:
        result.exit_code, result.outcome = ExitCode.OWN_CAP, ExitCode.OWN_CAP.outcome
    elif verdict.slice_full and status != 0:
        result.exit_code, result.outcome = ExitCode.SLICE_FULL, ExitCode.SLICE_FULL.outcome
    elif status < 0:
        result.exit_code, result.outcome = SIGNAL_BASE - status, "signal"
    else:
        result.exit_code = status
    if verdict.killed and status == 0:
        say("warning: a process of the job was OOM-killed, but the job exited 0; passing 0 through")
    return result


def _watch(
    settings: Settings, job: JobCgroup, proc: subprocess.Popen[bytes], max_runtime: float | None,
    signals: _Signals, say: Callable[[str], None],
) -> tuple[int, bool]:
    """Wait for the main process, sampling memory; enforce max runtime and forwarded signals."""
    pidfd = os.pidfd_open(proc.pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    deadline = time.monotonic() + max_runtime if max_runtime is not None else None
    kill_at: float | None = None
    timed_out = False
    peak = 0
    try:
        while not poller.poll(SAMPLE_INTERVAL * 1000):
            peak = max(peak, job.sample())
            now = time.monotonic()
            if signals.pending:
                sig = signals.pending.pop(0)
                if kill_at is not None:
                    job.kill_all()
                else:
                    _signal_group(proc.pid, sig)
                    kill_at = now + settings.kill_grace
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                say(f"max runtime reached; stopping the job (SIGTERM, SIGKILL after "
                    f"{settings.kill_grace:g} s)")
                _signal_group(proc.pid, signal.SIGTERM)
                job.signal_all(signal.SIGTERM)
                kill_at = now + settings.kill_grace
            if kill_at is not None and now >= kill_at:
                job.kill_all()
                kill_at = now + 3600
        proc.wait()
    finally:
        os.close(pidfd)
    return peak, timed_out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
