"""Run one job on this host: book it, wait for room, run it capped, judge the outcome, release.

Order of events, chosen so that nothing can run unbooked and the kernel's slow cgroup entry overlaps
hostrun's own work: make the job's cgroup, start the guardian, fork the job's process (it enters the
cgroup and waits), enqueue and wait for admission in the ledger, then let the process exec.

The job runs in its own process group. hostrun forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to that group,
then kills the whole cgroup after ``kill_grace``; a second signal kills at once. When the main process
exits, whatever it left in the cgroup is killed too. A forked guardian does the same if hostrun dies.

With ``--gpu-memory`` the job is booked on a GPU as well, gets that device in ``CUDA_VISIBLE_DEVICES``,
has its stdout/stderr teed through pipes and scanned, and the kernel log is watched during the run: a
GPU out-of-memory in either makes a failed run exit 245. On a host with NVIDIA GPUs (one directory
read per job: ``has_nvidia_gpus``) every other job has the kernel log watched too (the small
``dispatch.local.kernlog``), its output left alone. ``dispatch.local.gpu`` is imported for
``--gpu-memory`` alone; a host without GPUs pays one failed directory read.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable

from dispatch.capping.base import CapBackend, JobCgroup
from dispatch.core.errors import BackendError, LedgerError, NeverFitsError, NoCapBackendError, UsageError
from dispatch.core.exitcodes import SIGNAL_BASE, ExitCode, from_wait_status
from dispatch.core.hostfacts import has_nvidia_gpus
from dispatch.core.outcome import Outcome
from dispatch.core.procinfo import start_time
from dispatch.core.request import JOB_ENV, RunRequest, job_environment
from dispatch.core.settings import HostSettings, Settings
from dispatch.core.text import storable
from dispatch.core.units import format_size
from dispatch.local.admission import wait_for_room
from dispatch.local.admitpolicy import Admission, Room
from dispatch.local.booking import Plan, default_label, plan_booking
from dispatch.local.guardian import DEADLINE_MARGIN, Guardian
from dispatch.local.hostslice import LocalSlice
from dispatch.local.ledger import Ledger
from dispatch.local.ledgerdb import record_outcome
from dispatch.local.signals import FORWARDED as FORWARDED
from dispatch.local.signals import ForwardedSignals as _Signals
from dispatch.local.spawn import CGROUP_FAILED, PreparedChild

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.local.gpu import GpuRun
    from dispatch.local.kernlog import KernelWatch
    from dispatch.local.ledgerdb import Booking

SAMPLE_INTERVAL = 0.05
FAST_SAMPLE_INTERVAL = 0.01  # short jobs are over before a 50 ms sample would see them
FAST_SAMPLING_FOR = 1.0
# They end a wait for room, as SIGINT does (KeyboardInterrupt).
WAIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _Foreground:
    """Give the terminal to the job while it runs, so it can read from it and gets Ctrl-C directly.

    The job has its own process group; without this, a job reading the terminal would be stopped by
    SIGTTIN. Only when hostrun itself holds the terminal's foreground.
    """

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.fd = -1
        self._old_ttou: object = None

    @property
    def active(self) -> bool:
        return self.fd >= 0

    def __enter__(self) -> _Foreground:
        try:
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                # In the background we must still print (status lines) and take the terminal back,
                # even under ``stty tostop``.
                self._old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                os.tcsetpgrp(0, self.pgid)
                self.fd = 0
        except OSError:
            self.fd = -1
        return self

    def follow_stop(self, pid: int) -> int | None:
        """Job control, as a shell does it: when the job is stopped (Ctrl-Z), take the terminal
        back and stop hostrun too, so the user's shell regains it; on ``fg`` (SIGCONT) hand the
        terminal to the job again and continue it. Returns the wait status if the job has exited."""
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:
            return None
        if reaped == 0:
            return None
        if not os.WIFSTOPPED(status):
            return status
        os.tcsetpgrp(self.fd, os.getpgrp())
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once our shell continues us
        try:
            os.tcsetpgrp(self.fd, self.pgid)
        except OSError:
            pass
        _signal_group(self.pgid, signal.SIGCONT)
        return None

    def __exit__(self, *exc: object) -> None:
        if self.fd < 0:
            return
        try:
            os.tcsetpgrp(self.fd, os.getpgrp())
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, self._old_ttou)  # type: ignore[arg-type]


class _Interrupted(Exception):
    """A signal arrived while the job was still waiting for room (nothing ran yet)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise _Interrupted(signum)


def run_local(settings: Settings, request: RunRequest, say: Callable[[str], None],
              on_wait: Callable[[Admission], None] | None = None, alerts: bool = True,
              wait_alert: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Book, wait, run and judge one job on this host; the Outcome carries the exit code.

    A script declaring preflight conditions is checked first (``with_preflight``). With ``alerts``
    (a run for a controller on this host; a peer's agent passes False, its controller alerts from the
    outcome), a long wait, an own-cap kill (250) and a slice-full kill (254) are alerted
    (``dispatch.local.alertlog``). ``wait_alert``: a peer's agent gets a long wait's figures there,
    for its controller to alert.
    """
    return with_preflight(settings, request, say,
                          lambda: _run_local(settings, request, say, on_wait, alerts, wait_alert))


def with_preflight(settings: Settings, request: RunRequest, say: Callable[[str], None],
                   run: Callable[[], Outcome], elsewhere: str | None = None) -> Outcome:
    """``run()``, unless the script ``request.argv`` runs declares preflight conditions
    (``# admission:``, ``# run-condition:``; ``dispatch.local.preflight``) that are unmet: then print each
    unmet one and return exit 78 with nothing created, booked or run. A single-instance lock is held
    for the whole run; the inputs' fingerprint is recorded only when the job exited 0.

    ``elsewhere`` names a host whose node the job will run on, out of reach until it starts (a
    cluster): the admission and the single-instance lock are this tree's and are checked here; a
    condition about the machine (command, device, min-free) cannot be, and refuses the run (78).
    """
    from dispatch.guards.headers import declares_preflight

    if not declares_preflight(request.argv):
        return run()
    from dispatch.local.preflight import check, declared

    script = declared(request.argv)  # malformed: UsageError (2)
    if script is None:
        return run()
    host = elsewhere or settings.local.name
    label = request.label or default_label(request.argv)
    if elsewhere is not None:
        machine = [c for c in script.conditions if c.kind in ("command", "device", "min-free")]
        if machine:
            first = machine[0]
            return Outcome.of(ExitCode.NOT_RUN, host=host, label=label, argv=list(request.argv),
                              message=f"{script.path}:{first.line}: run-condition {first.kind} is "
                                      f"about the machine the job runs on, a node of {elsewhere} that "
                                      "cannot be checked before the job starts; nothing ran")
    environ = os.environ if request.env is None else request.env
    verdict, guard = check(settings, script, environ, force=request.force, hold=True)
    if guard is None:
        for line in [] if verdict.nothing_to_do else verdict.unmet_lines():
            say(line)  # a skip (inputs unchanged) is said in one line: the summary
        return Outcome.of(ExitCode.NOT_RUN, host=host, label=label, argv=list(request.argv),
                          message=verdict.summary())
    if verdict.unmet:  # only the admission, overridden by --force
        say(verdict.summary())
    try:
        outcome = run()
        if outcome.exit_code == 0 and outcome.outcome == "exit":
            try:
                guard.succeeded()
            except OSError as exc:
                say(f"warning: the job succeeded, but its inputs could not be recorded: {exc}")
        return outcome
    finally:
        guard.release()


def _run_local(settings: Settings, request: RunRequest, say: Callable[[str], None],
               on_wait: Callable[[Admission], None] | None = None, alerts: bool = False,
               wait_alert: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    if not request.argv:
        raise UsageError("no command given (usage: hostrun [OPTIONS] -- CMD [ARGS...])")
    here = LocalSlice(settings)
    host, backend = here.host, here.backend
    if not backend.caps_memory and not request.no_cap:
        raise NoCapBackendError(
            "no memory-cap backend works on this host (run 'hostrun doctor' to see why); "
            "pass --no-cap to run uncapped anyway"
        )
    limit = here.limit
    cap = request.cap if request.cap is not None else host.default_cap
    if cap is not None and cap > limit:
        raise NeverFitsError(
            f"cap {format_size(cap)} is larger than the whole slice ({format_size(limit)}); "
            "it could never be admitted"
        )
    base_env = dict(os.environ if request.env is None else request.env)
    gpu: GpuRun | None = None
    watch: KernelWatch | None = None  # the kernel log, on a host with GPUs; gpu when there is one
    if request.gpu_memory is not None:
        from dispatch.local.gpu import GpuRun, preflight

        # Refuse at once what has no GPU or could never fit: before anything is created or booked.
        gpu = watch = GpuRun(request.gpu_memory, preflight(request.gpu_memory, base_env))
    elif has_nvidia_gpus():
        from dispatch.local.kernlog import KernelWatch

        watch = KernelWatch()
    backend.ensure_slice(limit)
    env = job_environment(base_env, request.threads or host.threads(), request.threads is not None)
    me = os.getpid()
    job = backend.create_job(f"{me}-{start_time(me) or 0}", cap if cap is not None else limit)
    if job.path:
        env[JOB_ENV] = job.path
    guardian: Guardian | None = None
    child: PreparedChild | None = None
    ledger: Ledger | None = None
    booking_id: int | None = None
    old_mask: set[int | signal.Signals] | None = None
    try:
        guardian = Guardian.start(settings.state_dir, job)
        outputs = gpu.start_output() if gpu is not None else None
        child = PreparedChild.fork(job, request.argv, env, outputs)
        if gpu is not None and gpu.tee is not None:
            gpu.tee.parent_side()
        guardian.job_started(child.pid)
        ledger = Ledger(settings.state_dir, say, here.live_jobs)
        label = storable(request.label or default_label(request.argv))  # a text key in the ledger
        plan = plan_booking(cap=cap, peak=ledger.peak(label, host.name), slice_limit=limit,
                            gamble_size=settings.gamble_size_for(host))
        # From the moment the booking exists, a SIGTERM/SIGHUP/SIGQUIT must end the wait cleanly
        # (release it, say "nothing ran"): held back until _wait has its handlers in place.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAIT_SIGNALS)
        booking_id = ledger.enqueue(
            host=host.name, label=label, pid=me, pid_start=start_time(me) or 0, size=plan.size,
            cap=plan.limit, kind=plan.kind, command=" ".join(request.argv), session=request.session,
            cgroup=job.path or None, gpu_bytes=request.gpu_memory, group=request.group,
            when_idle=request.when_idle,
        )
        guardian.booked(booking_id)
        if (alerts or wait_alert is not None) and settings.alert_wait_after > 0:
            on_wait = _wait_alert(settings, host.name, label, request, say, on_wait, wait_alert)
        waited, signum = _wait(settings, ledger, backend, host, booking_id, limit, say, gpu, on_wait,
                               (job, plan, label) if backend.name == "shared" else None)
        if waited is None:
            child.cancel()
            return Outcome(
                exit_code=SIGNAL_BASE + signum, outcome="signal", host=host.name, label=label,
                argv=list(request.argv), message="interrupted while waiting for room; nothing ran",
            )
        if gpu is not None:
            booked = ledger.booking(booking_id)
            index = booked.gpu_index if booked is not None else None
            gpu.device = gpu.snapshot.device(index) if index is not None else None
            if gpu.device is None:
                raise BackendError(f"booked on GPU {index}, which nvidia-smi no longer lists")
        outcome = _run(settings, host, backend, job, child, request, label, plan, say, gpu, watch,
                       guardian)
        outcome.waited_s = round(waited, 3)
        record_outcome(settings, ledger, outcome, request, cap, plan.kind, say)
        if alerts and outcome.exit_code in (ExitCode.OWN_CAP, ExitCode.SLICE_FULL):
            from dispatch.local import alertlog

            alert = alertlog.for_outcome(outcome, request.session, slice_limit=limit, request=request)
            if alert is not None:
                alertlog.write(settings.alerts_path, alert, say)
        return outcome
    finally:
        if child is not None:
            child.cancel()
        job.kill_all()
        if watch is not None:
            watch.close()
        if ledger is not None:
            if booking_id is not None:
                try:
                    ledger.release(booking_id)  # first: the next job may start while we tidy up
                except LedgerError as exc:  # a dead holder's booking: the next admission reclaims it
                    say(f"warning: could not release booking {booking_id}: {exc}")
            ledger.close()
        try:
            job.remove()
        except OSError as exc:
            say(f"warning: could not remove {job.path}: {exc.strerror}")
        if guardian is not None:
            guardian.dismiss()
        if old_mask is not None:  # last: a signal held back before the wait now acts as it would have
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _wait_alert(settings: Settings, host: str, label: str, request: RunRequest,
                say: Callable[[str], None], then: Callable[[Admission], None] | None,
                deliver: Callable[[dict[str, Any]], None] | None = None
                ) -> Callable[[Admission], None]:
    """The wait's callback that raises ``alertlog.WaitAlert`` once the job has waited
    ``alert_wait_after``; the alert code is imported only then (most jobs never wait that long)."""
    started = time.monotonic()
    alert: list[Callable[[Admission], None]] = []

    def on_wait(adm: Admission) -> None:
        if not alert and time.monotonic() - started >= settings.alert_wait_after:
            from dispatch.local.alertlog import WaitAlert

            alert.append(WaitAlert(settings.alerts_path, settings.alert_wait_after, host, label,
                                   request.session, request.argv, say, then, started=started,
                                   deliver=deliver))
        if alert:
            alert[0](adm)
        elif then is not None:
            then(adm)

    return on_wait


def _wait(settings: Settings, ledger: Ledger, backend: CapBackend, host: HostSettings,
          booking_id: int, limit: int, say: Callable[[str], None],
          gpu: GpuRun | None = None, on_wait: Callable[[Admission], None] | None = None,
          shared: tuple[JobCgroup, Plan, str] | None = None,
          ) -> tuple[float | None, int]:
    """(seconds waited for admission, 0), or (None, signal) when a signal ended the wait.

    ``shared`` (the job, its plan and label on a shared slice): the daemon admits it first, across
    every user's bookings; then this user's own rules (groups, GPUs) on a room the daemon has made.
    """
    old = {sig: signal.signal(sig, _raise_interrupted) for sig in WAIT_SIGNALS}
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WAIT_SIGNALS)  # one held back since enqueue: now
        room = None
        waited = 0.0
        if shared is not None:
            from dispatch.capping.shared import SharedJob

            job, plan, label = shared
            assert isinstance(job, SharedJob)
            waited = job.wait_admitted(plan.size, plan.limit, label, settings.status_interval, say)

            def room(running: list[Booking]) -> Room:
                return Room(limit)
        return waited + wait_for_room(
            ledger, backend, host.name, booking_id, limit, settings.status_interval, say,
            gpu.snapshot if gpu is not None else None, on_wait, settings.groups,
            settings.queue_policy == "backfill", room), 0
    except KeyboardInterrupt:
        return None, signal.SIGINT
    except _Interrupted as exc:
        return None, exc.signum
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _run(
    settings: Settings, host: HostSettings, backend: CapBackend, job: JobCgroup, child: PreparedChild,
    request: RunRequest, label: str, plan: Plan, say: Callable[[str], None], gpu: GpuRun | None = None,
    watch: KernelWatch | None = None, guardian: Guardian | None = None,
) -> Outcome:
    result = Outcome(
        exit_code=0, outcome="exit", host=host.name, label=label, argv=list(request.argv),
        cap_bytes=plan.limit, booking_kind=plan.kind, booked_bytes=plan.size,
        backend=backend.name, cgroup=job.path or None,
    )
    extra_env = None
    if gpu is not None and gpu.device is not None:
        from dispatch.local.gpu import device_environment

        extra_env = device_environment(gpu.device)
        result.gpu_index, result.gpu_bytes = gpu.device.index, gpu.need
    if watch is not None:
        watch.job_starts()  # the kernel log counts from here
    started = time.monotonic()
    with _Signals() as signals, _Foreground(child.pid) as foreground:
        failed = child.go(plan.oom_score_adj, extra_env)
        if failed is not None:
            code, reason = failed
            if code == CGROUP_FAILED:
                raise BackendError(reason)
            result.exit_code = code
            result.message = f"cannot run {request.argv[0]!r}: {reason}"
            return result
        if gpu is not None:
            gpu.start_sampling(job.pids)  # the VRAM peak, recorded for the label (--gpu-memory auto)
        max_runtime = request.max_runtime if request.max_runtime is not None else host.max_runtime
        status, peak, timed_out = _watch(settings, job, child.pid, max_runtime, signals, say,
                                         foreground, watch, guardian)
    result.duration_s = round(time.monotonic() - started, 3)
    job.kill_all()
    vram = watch.finish() if watch is not None else None  # the rest of its output, then the verdict
    if gpu is not None:
        result.vram_peak_bytes = gpu.vram_peak
    verdict = job.verdict()
    result.counters = verdict.counters
    # Sampling can miss a short spike; the kernel's high-water mark less the page cache still
    # charged catches it. At its own cap the job used everything reclaim could not free.
    peak = max(peak, job.peak_estimate())
    if verdict.own:
        peak = max(peak, job.charged_peak())
    result.peak_bytes = peak
    result.hit_ceiling = verdict.own
    failed_run = not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
    if timed_out:
        result.mark(ExitCode.MAX_RUNTIME)
    elif verdict.own and failed_run:
        result.mark(ExitCode.OWN_CAP)
    elif verdict.slice_full and failed_run:
        result.mark(ExitCode.SLICE_FULL)
    elif vram is not None and failed_run:
        result.mark(ExitCode.VRAM)
        result.vram_evidence = vram
        result.message = f"GPU out of memory: {vram}"
    else:
        result.exit_code, result.outcome = from_wait_status(status)
    if verdict.killed and not failed_run:
        say("warning: a process of the job was OOM-killed, but the job exited 0; passing 0 through")
    elif verdict.killed and not (verdict.own or verdict.slice_full or timed_out):
        # Neither its cap nor the slice: the whole machine ran out (memory used outside the slice).
        result.message = ("a process of the job was OOM-killed by a machine-wide out-of-memory, not at "
                          "its cap or the slice's; the job's own status passes through")
        say(f"warning: {result.message}")
    if vram is not None and not failed_run:
        result.vram_evidence = vram
        say(f"warning: {vram} (a GPU out-of-memory), but the job exited 0; passing 0 through")
    return result


def _watch(
    settings: Settings, job: JobCgroup, pid: int, max_runtime: float | None, signals: _Signals,
    say: Callable[[str], None], foreground: _Foreground | None = None, watch: KernelWatch | None = None,
    guardian: Guardian | None = None,
) -> tuple[int, int, bool]:
    """Wait for the main process, sampling memory; enforce max runtime and forwarded signals.

    With ``watch``, also scan the kernel log each sample, and forward a ``--gpu-memory`` job's teed
    output as it comes.
    Returns (raw wait status, peak bytes sampled, whether max runtime stopped it).
    """
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    tee = watch.tee if watch is not None else None
    if tee is not None:
        tee.register(poller)
    begun = last = time.monotonic()
    deadline = begun + max_runtime if max_runtime is not None else None
    if deadline is not None and guardian is not None:
        guardian.deadline(deadline, settings.kill_grace)  # kept even while this process is stopped
    kill_at: float | None = None
    timed_out = False
    peak = 0
    status: int | None = None
    try:
        while True:
            interval = FAST_SAMPLE_INTERVAL if last - begun < FAST_SAMPLING_FOR else SAMPLE_INTERVAL
            events = poller.poll(max(0.0, last + interval - time.monotonic()) * 1000)
            if events:
                if any(fd == pidfd for fd, _ in events):
                    break
                for fd, mask in events:
                    if tee is not None:
                        tee.handle(poller, fd, mask)
                if time.monotonic() - last < interval:
                    continue  # only output to forward: not yet time to sample
            last = time.monotonic()
            if foreground is not None and foreground.active:
                status = foreground.follow_stop(pid)
                if status is not None:
                    break  # reaped while checking for a stop: it has exited
            peak = max(peak, job.sample())
            if watch is not None:
                watch.tick()
            now = time.monotonic()
            if signals.pending:
                sig = signals.pending.pop(0)
                if kill_at is not None:
                    job.kill_all()
                else:
                    _signal_group(pid, sig)
                    kill_at = now + settings.kill_grace
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                if now >= deadline + DEADLINE_MARGIN and guardian is not None:
                    # This process was not running at the deadline (stopped): the guardian kept it.
                    say(f"max runtime ({max_runtime:g} s) passed while hostrun was stopped; its "
                        "guardian stopped the job")
                else:
                    if guardian is not None:
                        guardian.stopping()
                    say(f"max runtime reached; stopping the job (SIGTERM, SIGKILL after "
                        f"{settings.kill_grace:g} s)")
                    _signal_group(pid, signal.SIGTERM)
                    job.signal_all(signal.SIGTERM)
                kill_at = now + settings.kill_grace
            if kill_at is not None and now >= kill_at:
                job.kill_all()
                kill_at = now + 3600
        if status is None:
            _, status = os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    if (deadline is not None and not timed_out and guardian is not None
            and time.monotonic() >= deadline + DEADLINE_MARGIN):
        timed_out = True  # it ended while this process was stopped: the guardian stopped it
        say(f"max runtime ({max_runtime:g} s) passed while hostrun was stopped; its guardian stopped "
            "the job")
    return status, peak, timed_out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
