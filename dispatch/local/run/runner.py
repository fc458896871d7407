"""Run one job on this host once the admission engine admitted it: run it capped, judge the
outcome, record, release.

Order of events, chosen so that nothing can run unbooked: the engine books the run and admits it
(``dispatch.local.engine.enginebook``, before this module is loaded), then the job's cgroup is made, the
guardian started, the job's process forked (it enters the cgroup and waits), and let exec.

The job runs in its own process group. hostrun forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to that group,
then kills the whole cgroup after ``kill_grace``; a second signal kills at once (the watch while it
runs: ``dispatch.local.run.jobwatch``). When the main process exits, whatever it left in the cgroup is
killed too. A forked guardian does the same if hostrun dies.

With ``--gpu-memory`` the job is booked on a GPU as well, gets that device in ``CUDA_VISIBLE_DEVICES``,
has its stdout/stderr teed through pipes and scanned, and the kernel log is watched during the run: a
GPU out-of-memory in either makes a failed run exit 245. On a host with NVIDIA GPUs (one directory
read per job: ``has_nvidia_gpus``) every other job has the kernel log watched too (the small
``dispatch.local.gpus.kernlog``), its output left alone. ``dispatch.local.gpus.gpu`` is imported for
``--gpu-memory`` alone; a host without GPUs pays one failed directory read.
"""

from __future__ import annotations

import os
import time

from dispatch.capping.base import CapBackend, JobCgroup
from dispatch.core.errors import BackendError, LedgerError, UsageError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.hostfacts import has_nvidia_gpus
from dispatch.core.outcome import Outcome
from dispatch.core.procinfo import start_time
from dispatch.core.request import JOB_ENV, SESSION_ENV, RunRequest, job_environment
from dispatch.core.settings import HostSettings, Settings
from dispatch.core.text import storable
from dispatch.core.units import format_size
from dispatch.core.verdicts import JobEvidence, job_verdict
from dispatch.local.admission.booking import (
    Plan,
    as_admitted_kind,
    default_label,
)
from dispatch.local.engine import enginebook
from dispatch.local.engine.admitclient import Link
from dispatch.local.engine.enginebook import Booked
from dispatch.local.engine.waitwatch import watch_for
from dispatch.local.hostslice import LocalSlice
from dispatch.local.run.guardian import Guardian
from dispatch.local.run.jobwatch import Foreground, JobWatch
from dispatch.local.run.signals import FORWARDED as FORWARDED
from dispatch.local.run.signals import ForwardedSignals as _Signals
from dispatch.local.run.spawn import CGROUP_FAILED, PreparedChild
from dispatch.local.store import ramp
from dispatch.local.store.runrecord import record_outcome

MYPY = False
if MYPY:
    import signal
    from collections.abc import Callable
    from typing import Any

    from dispatch.core.alertshape import WaitFigures
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.admission.policy import Admission
    from dispatch.local.gpus.gpu import GpuRun
    from dispatch.local.gpus.kernlog import KernelWatch
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal

def run_booked(settings: Settings, request: RunRequest, say: Callable[[str], None],
               on_wait: Callable[[Admission], None] | None = None, alerts: bool = True,
               wait_alert: Callable[[WaitFigures], None] | None = None,
               booked: Booked | None = None, here: LocalSlice | None = None) -> Outcome:
    """The steps of a local run in their order (docs/design.md, "A local run"); what each step
    takes is held by a ``_LocalRun`` and given back by its ``release``, however the run ends.
    ``booked``: the admission engine booked it and it was admitted (``dispatch.local.run.localrun``);
    else it is booked through the engine here. ``here``: the shared slice the front door found.

    With ``alerts`` (a run for a controller on this host; a peer's agent passes False, its controller
    alerts from the outcome), a long wait, an own-cap kill (250) and a slice-full kill (254) are
    alerted (``dispatch.local.alertlog``). ``wait_alert``: a peer's agent gets a long wait's figures
    there, for its controller to alert.

    A job that may be requeued (``Settings.may_requeue``) and was killed because the slice filled
    (254) runs again, up to ``MAX_REQUEUES`` times: its label is marked by then, so it is booked at
    its cap, and it keeps its place in the queue (the same booking id)."""
    if not request.argv:
        raise UsageError("no command given (usage: hostrun [OPTIONS] -- CMD [ARGS...])")
    try:
        here = here or LocalSlice(settings)
        cap = here.checked_cap(request.cap, request.no_cap)
    except BaseException:
        _drop(booked)
        raise
    label = storable(request.label or default_label(request.argv))
    requeue = settings.may_requeue(label, request.group, request.requeue)
    place: int | None = None
    for requeued in range(MAX_REQUEUES + 1):
        if booked is None:  # a requeue (or a caller that did not book it): booked by the engine now
            from dispatch.local.shared.sharedlink import engine_link

            watch = watch_for(settings, here.host.name, label, request, say, on_wait, alerts, wait_alert)
            try:
                booked = enginebook.book(settings, request, label, requeue, place, say, watch,
                                         link=engine_link(settings, say, here),
                                         gpu=enginebook.gpu_want(request))
            except enginebook.Interrupted as exc:
                return enginebook.interrupted_outcome(settings, request, label, exc.signum)
        try:
            run = _LocalRun(settings, request, say, here, cap, booked)
        except BaseException:
            _drop(booked)
            raise
        booked = None
        try:
            again = requeue and requeued < MAX_REQUEUES  # a slice-full kill now runs it again
            outcome, plan = run.attempt(label, requeue, again, alerts)
            outcome.requeued = requeued
            if not (again and outcome.is_verdict(ExitCode.SLICE_FULL)):
                return outcome
            place = run.booking_id
            line = (f"REQUEUE {label} (booking {place}): killed when the slice filled, booked as "
                    f"{plan.kind} {format_size(plan.size)}; runs again at its cap "
                    f"({requeued + 1} of {MAX_REQUEUES})")
            say(line.replace("REQUEUE ", "requeued: ", 1))
            run.open_ledger().log([line])
        finally:
            run.release()
    raise AssertionError("unreachable: the last attempt returns")


def _drop(booked: Booked | None) -> None:
    """An admitted booking whose run failed before it held it: released at once."""
    if booked is not None:
        enginebook.give_back(booked.link, booked.mask)


MAX_REQUEUES = 2  # a requeued job is booked at its cap: a second kill means others undercounted


class _LocalRun:
    """What one local run holds, from its job cgroup to its booking, so that ``release`` gives it
    all back in one place, in the order that lets the next job start soonest.

    Made once the engine admitted the run (``booked``): the slice and the job's cgroup are made,
    and the booking holds the job (``JobCgroup.held_by``: told its cgroup, or, on a shared slice,
    asked for its scope).
    """

    def __init__(self, settings: Settings, request: RunRequest, say: Callable[[str], None],
                 here: LocalSlice, cap: int | None, booked: Booked) -> None:
        self.settings, self.request, self.say, self.here, self.cap = settings, request, say, here, cap
        self.host, self.backend, self.limit = here.host, here.backend, here.limit
        self.booked = booked
        base_env = dict(os.environ if request.env is None else request.env)
        self.gpu: GpuRun | None = None
        self.watch: KernelWatch | None = None  # the kernel log, on a host with GPUs; gpu when there is one
        if request.gpu_memory is not None:
            from dispatch.local.gpus.gpu import GpuRun, preflight

            # Refuse at once what has no GPU or could never fit: before anything is created or booked.
            self.gpu = self.watch = GpuRun(request.gpu_memory, preflight(request.gpu_memory, base_env))
        elif has_nvidia_gpus():
            from dispatch.local.gpus.kernlog import KernelWatch

            self.watch = KernelWatch()
        self.backend.ensure_slice(self.limit)
        self.env = job_environment(base_env, request.threads or self.host.threads(),
                                   request.threads is not None)
        me = os.getpid()
        holder = f"{me}-{start_time(me) or 0}"
        if request.role == "session":  # its own cgroup in the sessions slice, with a high mark
            sessions = settings.sessions
            size = cap if cap is not None else self.limit
            self.backend.ensure_sessions(sessions.limit(self.limit))
            self.job = self.backend.create_session(holder, size, sessions.high_mark(size))
            self.env.pop(JOB_ENV, None)  # its hostrun runs are jobs of their own, not nested in it
            self.env[SESSION_ENV] = self.job.path
        else:
            self.job = self.backend.create_job(holder, cap if cap is not None else self.limit)
            if self.job.path:
                self.env[JOB_ENV] = self.job.path
        self.guardian: Guardian | None = None
        self.child: PreparedChild | None = None
        self.ledger: Ledger | None = None
        self.link: Link = booked.link  # the admission engine's connection: the booking is its
        self.booking_id = booked.booking_id
        self.job.held_by(booked.link)

    def open_ledger(self) -> Ledger:
        from dispatch.local.admission import ledger  # a run the engine booked opens none

        self.ledger = ledger.Ledger(self.settings.state_dir, self.say, self.here.live_jobs)
        return self.ledger

    def start(self) -> tuple[Guardian, PreparedChild]:
        """The guardian, then the job's process (it enters the cgroup and blocks until ``go``)."""
        self.guardian = guardian = Guardian.start(self.settings.state_dir, self.job)
        gpu = self.gpu
        outputs = gpu.start_output() if gpu is not None else None
        self.child = child = PreparedChild.fork(self.job, self.request.argv, self.env, outputs)
        if gpu is not None and gpu.tee is not None:
            gpu.tee.parent_side()
        guardian.job_started(child.pid)
        return guardian, child

    def attempt(self, label: str, requeue: bool, again: bool, alerts: bool) -> tuple[Outcome, Plan]:
        """One run of the job the engine admitted: run, record. ``requeue``: it may have been lent
        room; ``again``: a slice-full kill runs it again (no alert then)."""
        settings, request, say, booked = self.settings, self.request, self.say, self.booked
        plan = Plan(*booked.plan)
        if requeue:  # only such a job may have been lent room (``lending``)
            plan = as_admitted_kind(plan, booked.admitted_kind)
        self.on_device(booked.gpu_index)
        guardian, child = self.start()
        outcome = _run(settings, self.host, self.backend, self.job, child, request, label, plan, say,
                       self.gpu, self.watch, guardian, booked.mask)
        outcome.waited_s = round(booked.waited, 3)
        again = again and outcome.is_verdict(ExitCode.SLICE_FULL)
        self.record(outcome, plan, alerts and not again)
        return outcome, plan

    def on_device(self, index: int | None) -> None:
        """A ``--gpu-memory`` job runs on GPU ``index``, one of those it may have (it gets its UUID)."""
        gpu = self.gpu
        if gpu is None:
            return
        gpu.device = gpu.snapshot.device(index) if index is not None else None
        if gpu.device is None:
            raise BackendError(f"booked on GPU {index}, which nvidia-smi no longer lists"
                               if index is not None else "admitted without a GPU; nothing ran")

    def record(self, outcome: Outcome, plan: Plan, alerts: bool) -> None:
        """The peak and the history row (through the engine when it booked the run: it holds the
        ledger open); with ``alerts``, an alert for a kill at the job's own cap (250) or a full
        slice (254)."""
        record_outcome(self.settings, self.link, outcome, self.request, self.cap, plan.kind, self.say)
        if alerts and outcome.is_verdict(ExitCode.OWN_CAP, ExitCode.SLICE_FULL):
            from dispatch.local import alertlog

            alertlog.write(self.settings.alerts_path, alertlog.for_outcome(
                outcome, self.request.session, slice_limit=self.limit, request=self.request), self.say)

    def _release_failed(self, exc: LedgerError) -> None:
        """A dead holder's booking: the next admission reclaims it."""
        self.say(f"warning: could not release booking {self.booking_id}: {exc}; its holder has ended, "
                 "so the next run on this host releases it once the state dir can be written again")

    def release(self) -> None:
        """Give back whatever was taken: the job's processes killed, the booking released first
        (the next job may start while we tidy up), then the cgroup, the guardian; a signal held back
        before the wait acts last, as it would have."""
        if self.child is not None:
            self.child.cancel()
        self.job.kill_all()
        if self.watch is not None:
            self.watch.close()
        try:
            self.link.release()
        except LedgerError as exc:
            self._release_failed(exc)
        self.link.close()
        if self.ledger is not None:  # opened for a requeue's log line
            self.ledger.close()
        try:
            self.job.remove()
        except OSError as exc:
            self.say(f"warning: could not remove {self.job.path}: {exc.strerror}")
        if self.guardian is not None:
            self.guardian.dismiss()
        if self.booked.mask is not None:  # a run that ended before its handlers were in place
            signal.pthread_sigmask(signal.SIG_SETMASK, self.booked.mask)


def _run(
    settings: Settings, host: HostSettings, backend: CapBackend, job: JobCgroup, child: PreparedChild,
    request: RunRequest, label: str, plan: Plan, say: Callable[[str], None], gpu: GpuRun | None = None,
    watch: KernelWatch | None = None, guardian: Guardian | None = None, mask: Any = None,
) -> Outcome:
    """Let the admitted job exec, watch it to its end (``JobWatch``), then judge how it ended.
    ``mask``: the signal mask to set once the run's handlers are in place (held back till then)."""
    result = Outcome(
        exit_code=0, outcome="exit", host=host.name, label=label, argv=list(request.argv),
        cap_bytes=plan.limit, booking_kind=plan.kind, booked_bytes=plan.size,
        backend=backend.name, cgroup=job.path or None,
    )
    extra_env = None
    if gpu is not None and gpu.device is not None:
        from dispatch.local.gpus.gpu import device_environment

        extra_env = device_environment(gpu.device)
        result.gpu_index, result.gpu_bytes = gpu.device.index, gpu.need
    if watch is not None:
        watch.job_starts()  # the kernel log counts from here
    started = time.monotonic()
    with _Signals() as signals, Foreground(child.pid) as foreground:
        if mask is not None:  # one held back since admission is collected now, and forwarded
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
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
        max_runtime = request.max_runtime
        if max_runtime is None and request.role != "session":  # a session lasts as long as its user
            max_runtime = host.max_runtime
        watcher = JobWatch(settings, job, child.pid, max_runtime, signals, say, foreground, watch,
                           guardian, whole=request.role == "session")
        status, peak, timed_out = watcher.wait()
    result.duration_s = round(time.monotonic() - started, 3)
    job.kill_all()
    vram = watch.finish() if watch is not None else None  # the rest of its output, then the verdict
    if gpu is not None:
        result.vram_peak_bytes = gpu.vram_peak
    _judge(result, job, status, peak, timed_out, vram, say, whole=request.role == "session")
    if result.outcome == "exit" and result.peak_bytes:  # a killed run's profile ends early
        result.ramp = list(ramp.profile(watcher.rises, result.duration_s, result.peak_bytes))
    return result


def _judge(result: Outcome, job: JobCgroup, status: int, peak: int, timed_out: bool, vram: str | None,
           say: Callable[[str], None], whole: bool = False) -> None:
    """The ended job's evidence gathered (the cap backend's counters, its peak) and judged
    (``dispatch.core.verdicts.job_verdict``) into ``result``; its warnings said. ``whole``: an agent
    session, which a kill at its own cap ends whole (``JobWatch``)."""
    oom = job.oom_evidence()
    result.counters = oom.counters
    # Sampling can miss a short spike; the kernel's high-water mark less the page cache still
    # charged catches it. At its own cap the job used everything reclaim could not free.
    peak = max(peak, job.peak_estimate())
    if oom.own:
        peak = max(peak, job.charged_peak())
    result.peak_bytes = peak
    result.hit_ceiling = oom.own
    found = job_verdict(JobEvidence(status, timed_out, oom.own, oom.slice_full, oom.killed, vram, whole))
    result.exit_code, result.outcome = found.exit_code, found.outcome
    if found.message is not None:
        result.message = found.message
    if vram is not None:
        result.vram_evidence = vram
    for line in found.warnings:
        say(f"warning: {line}")
