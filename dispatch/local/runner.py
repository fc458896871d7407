"""Run one job on this host: book it, wait for room, run it capped, judge the outcome, release.

Order of events, chosen so that nothing can run unbooked and the kernel's slow cgroup entry overlaps
hostrun's own work: make the job's cgroup, start the guardian, fork the job's process (it enters the
cgroup and waits), enqueue and wait for admission in the ledger, then let the process exec.

The job runs in its own process group. hostrun forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to that group,
then kills the whole cgroup after ``kill_grace``; a second signal kills at once (the watch while it
runs: ``dispatch.local.jobwatch``). When the main process exits, whatever it left in the cgroup is
killed too. A forked guardian does the same if hostrun dies.

With ``--gpu-memory`` the job is booked on a GPU as well, gets that device in ``CUDA_VISIBLE_DEVICES``,
has its stdout/stderr teed through pipes and scanned, and the kernel log is watched during the run: a
GPU out-of-memory in either makes a failed run exit 245. On a host with NVIDIA GPUs (one directory
read per job: ``has_nvidia_gpus``) every other job has the kernel log watched too (the small
``dispatch.local.kernlog``), its output left alone. ``dispatch.local.gpu`` is imported for
``--gpu-memory`` alone; a host without GPUs pays one failed directory read.
"""

from __future__ import annotations

import os
import time

from dispatch.capping.base import CapBackend, JobCgroup
from dispatch.core.errors import BackendError, LedgerError, UsageError
from dispatch.core.exitcodes import ExitCode, from_wait_status
from dispatch.core.hostfacts import has_nvidia_gpus
from dispatch.core.outcome import Outcome
from dispatch.core.procinfo import start_time
from dispatch.core.request import JOB_ENV, RunRequest, job_environment
from dispatch.core.settings import HostSettings, Settings
from dispatch.core.text import storable
from dispatch.core.units import format_size
from dispatch.local import admitclient, enginebook, ramp
from dispatch.local.admitclient import Link
from dispatch.local.booking import (
    Plan,
    as_admitted,
    as_admitted_kind,
    default_label,
    gamble_line,
    plan_for,
)
from dispatch.local.enginebook import WAIT_SIGNALS, Booked
from dispatch.local.guardian import Guardian
from dispatch.local.hostslice import LocalSlice
from dispatch.local.jobwatch import Foreground, JobWatch
from dispatch.local.runrecord import record_outcome
from dispatch.local.signals import FORWARDED as FORWARDED
from dispatch.local.signals import ForwardedSignals as _Signals
from dispatch.local.spawn import CGROUP_FAILED, PreparedChild
from dispatch.local.waitwatch import watch_for

MYPY = False
if MYPY:
    import signal
    from collections.abc import Callable
    from typing import Any

    from dispatch.local.admitpolicy import Admission, Room
    from dispatch.local.gpu import GpuRun
    from dispatch.local.kernlog import KernelWatch
    from dispatch.local.ledger import Ledger
    from dispatch.local.ledgerdb import Booking
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal

def run_booked(settings: Settings, request: RunRequest, say: Callable[[str], None],
               on_wait: Callable[[Admission], None] | None = None, alerts: bool = True,
               wait_alert: Callable[[dict[str, Any]], None] | None = None,
               booked: Booked | None = None) -> Outcome:
    """The steps of a local run in their order (docs/design.md, "A local run"); what each step
    takes is held by a ``_LocalRun`` and given back by its ``release``, however the run ends.
    ``booked``: the admission engine booked it and it was admitted (``dispatch.local.localrun``);
    else it is booked here.

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
        here = LocalSlice(settings)
        cap = here.checked_cap(request.cap, request.no_cap)
    except BaseException:
        _drop(booked)
        raise
    label = storable(request.label or default_label(request.argv))
    requeue = settings.may_requeue(label, request.group, request.requeue)
    place: int | None = None
    engine = request.gpu_memory is None and here.backend.name != "shared" and admitclient.wanted()
    for requeued in range(MAX_REQUEUES + 1):
        if booked is None and engine and place is not None:  # a requeue, booked by the engine again
            watch = watch_for(settings, here.host.name, label, request, say, on_wait, alerts, wait_alert)
            try:
                booked = enginebook.book(settings, request, label, requeue, place, say, watch)
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
            outcome, plan = run.attempt(label, requeue, again, place, on_wait, alerts, wait_alert)
            outcome.requeued = requeued
            if not (again and outcome.is_verdict(ExitCode.SLICE_FULL)
                    and run.booking_id is not None):
                return outcome
            place = run.booking_id
            line = (f"REQUEUE {label} (booking {place}): killed when the slice filled, booked as "
                    f"{plan.kind} {format_size(plan.size)}; runs again at its cap "
                    f"({requeued + 1} of {MAX_REQUEUES})")
            say(line.replace("REQUEUE ", "requeued: ", 1))
            (run.ledger or run.open_ledger()).log([line])
        finally:
            run.release()
    raise AssertionError("unreachable: the last attempt returns")


def _drop(booked: Booked | None) -> None:
    """An admitted booking whose run failed before it held it: released at once."""
    if booked is not None:
        enginebook.give_back(booked.link)


MAX_REQUEUES = 2  # a requeued job is booked at its cap: a second kill means others undercounted


class _LocalRun:
    """What one local run holds, from its job cgroup to its booking, so that ``release`` gives it
    all back in one place, in the order that lets the next job start soonest.

    Made before anything is booked (a run taking the ledger's lock itself): a ``--gpu-memory``
    request no GPU here could take is refused first; then the slice and the job's cgroup are made,
    so the kernel's slow cgroup entry overlaps the booking and the wait that follow. A run the
    engine booked (``booked``) is made once admitted, and its booking is told its cgroup.
    """

    def __init__(self, settings: Settings, request: RunRequest, say: Callable[[str], None],
                 here: LocalSlice, cap: int | None, booked: Booked | None = None) -> None:
        self.settings, self.request, self.say, self.here, self.cap = settings, request, say, here, cap
        self.host, self.backend, self.limit = here.host, here.backend, here.limit
        self.booked = booked
        base_env = dict(os.environ if request.env is None else request.env)
        self.gpu: GpuRun | None = None
        self.watch: KernelWatch | None = None  # the kernel log, on a host with GPUs; gpu when there is one
        if request.gpu_memory is not None:
            from dispatch.local.gpu import GpuRun, preflight

            # Refuse at once what has no GPU or could never fit: before anything is created or booked.
            self.gpu = self.watch = GpuRun(request.gpu_memory, preflight(request.gpu_memory, base_env))
        elif has_nvidia_gpus():
            from dispatch.local.kernlog import KernelWatch

            self.watch = KernelWatch()
        self.backend.ensure_slice(self.limit)
        self.env = job_environment(base_env, request.threads or self.host.threads(),
                                   request.threads is not None)
        me = os.getpid()
        self.job = self.backend.create_job(f"{me}-{start_time(me) or 0}",
                                           cap if cap is not None else self.limit)
        if self.job.path:
            self.env[JOB_ENV] = self.job.path
        self.guardian: Guardian | None = None
        self.child: PreparedChild | None = None
        self.ledger: Ledger | None = None
        self.link: Link | None = None  # the admission engine's connection, when it admits this run
        self.booking_id: int | None = None
        self.old_mask: set[int | signal.Signals] | None = None
        if booked is not None:
            self.link, self.booking_id = booked.link, booked.booking_id
            booked.link.set_cgroup(self.job.path or "")

    def open_ledger(self) -> Ledger:
        from dispatch.local import ledger  # a run the engine booked opens none

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

    def attempt(self, label: str, requeue: bool, again: bool, place: int | None,
                on_wait: Callable[[Admission], None] | None, alerts: bool,
                wait_alert: Callable[[dict[str, Any]], None] | None) -> tuple[Outcome, Plan]:
        """One run of the job: book (unless the engine did), wait, run, record. ``requeue``: it may
        be booked at a guess; ``again``: a slice-full kill runs it again (no alert then);
        ``place``: a requeued job's booking id."""
        settings, request, say = self.settings, self.request, self.say
        booked = self.booked
        if booked is not None:
            plan = Plan(*booked.plan)
            waited = booked.waited
            if requeue:  # only such a job may have been lent room (``lending``)
                plan = as_admitted_kind(plan, booked.admitted_kind)
            self.start()
        else:
            # The guardian releases the booking of a run killed while waiting.
            self.start()
            ledger = self.open_ledger()
            plan, booking_id = self.enqueue(self.guardian, ledger, label, requeue, place)
            watch = watch_for(settings, self.host.name, label, request, say, on_wait, alerts, wait_alert)
            got, signum = _wait(settings, ledger, self.backend, self.host, booking_id, self.limit, say,
                                self.gpu, watch,
                                (self.job, plan, label) if self.backend.name == "shared" else None)
            if got is None:
                if self.child is not None:
                    self.child.cancel()
                return enginebook.interrupted_outcome(settings, request, label, signum), plan
            waited = got
            self.take_device(ledger, booking_id)
            if requeue:  # only such a job may have been lent room (``lending``)
                plan = as_admitted(plan, ledger.booking(booking_id))
        guardian, child = self.guardian, self.child
        assert guardian is not None and child is not None
        outcome = _run(settings, self.host, self.backend, self.job, child, request, label, plan, say,
                       self.gpu, self.watch, guardian)
        outcome.waited_s = round(waited, 3)
        again = again and outcome.is_verdict(ExitCode.SLICE_FULL)
        self.record(outcome, plan, alerts and not again)
        return outcome, plan

    def enqueue(self, guardian: Guardian | None, ledger: Ledger, label: str, requeue: bool = False,
                place: int | None = None) -> tuple[Plan, int]:
        """Plan the booking from the label's peak here and queue it: (plan, booking id).
        ``requeue``: a job with no peak here is booked at a guess (``booking.guess``);
        ``place``: the booking id it keeps (a requeued job)."""
        request, host = self.request, self.host
        plan = plan_for(ledger, host.name, label, storable(os.path.basename(request.argv[0])), self.cap,
                        self.limit, self.settings.gamble_size_for(host), requeue)
        # From the moment the booking exists, a SIGTERM/SIGHUP/SIGQUIT must end the wait cleanly
        # (release it, say "nothing ran"): held back until _wait has its handlers in place.
        self.old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAIT_SIGNALS)
        me = os.getpid()
        self.booking_id = booking_id = ledger.enqueue(
            host=host.name, label=label, pid=me, pid_start=start_time(me) or 0, size=plan.size,
            cap=plan.limit, kind=plan.kind, command=" ".join(request.argv), session=request.session,
            cgroup=self.job.path or None, group=request.group, when_idle=request.when_idle,
            booking_id=place, requeue=requeue, gpu_bytes=request.gpu_memory)
        if guardian is not None:
            guardian.booked(booking_id)
        if plan.why is not None:
            ledger.log([gamble_line(label, booking_id, plan)])
        return plan, booking_id

    def take_device(self, ledger: Ledger, booking_id: int) -> None:
        """A ``--gpu-memory`` job, admitted: the GPU its booking was given."""
        gpu = self.gpu
        if gpu is None:
            return
        booked = ledger.booking(booking_id)
        index = booked.gpu_index if booked is not None else None
        gpu.device = gpu.snapshot.device(index) if index is not None else None
        if gpu.device is None:
            raise BackendError(f"booked on GPU {index}, which nvidia-smi no longer lists")

    def record(self, outcome: Outcome, plan: Plan, alerts: bool) -> None:
        """The peak and the history row (through the engine when it booked the run: it holds the
        ledger open); with ``alerts``, an alert for a kill at the job's own cap (250) or a full
        slice (254)."""
        target = self.link if self.link is not None else (self.ledger or self.open_ledger())
        record_outcome(self.settings, target, outcome, self.request, self.cap, plan.kind, self.say)
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
        if self.link is not None:
            try:
                self.link.release()
            except LedgerError as exc:
                self._release_failed(exc)
            self.link.close()
            self.booking_id = None
        if self.ledger is not None:
            if self.booking_id is not None:
                try:
                    self.ledger.release(self.booking_id)
                except LedgerError as exc:
                    self._release_failed(exc)
            self.ledger.close()
        try:
            self.job.remove()
        except OSError as exc:
            self.say(f"warning: could not remove {self.job.path}: {exc.strerror}")
        if self.guardian is not None:
            self.guardian.dismiss()
        if self.old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old_mask)


def _wait(settings: Settings, ledger: Ledger, backend: CapBackend, host: HostSettings,
          booking_id: int, limit: int, say: Callable[[str], None],
          gpu: GpuRun | None = None, on_wait: Callable[[Admission], None] | None = None,
          shared: tuple[JobCgroup, Plan, str] | None = None) -> tuple[float | None, int]:
    """(seconds waited for admission, 0), or (None, signal) when a signal ended the wait.

    ``shared`` (the job, its plan and label on a shared slice): the daemon admits it first, across
    every user's bookings; then this user's own rules (groups, GPUs) on a room the daemon has made.
    """
    old = {sig: signal.signal(sig, enginebook.raise_interrupted) for sig in WAIT_SIGNALS}
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WAIT_SIGNALS)  # one held back since enqueue: now
        room = None
        waited = 0.0
        if shared is not None:
            from dispatch.capping.shared import SharedJob

            job, plan, label = shared
            assert isinstance(job, SharedJob)
            waited = job.wait_admitted(plan.size, plan.limit, label, settings.status_interval, say)

            from dispatch.local.admitpolicy import Room  # the direct path's: not a plain run's

            def room(running: list[Booking]) -> Room:
                return Room(limit)
        from dispatch.local.admission import wait_for_room

        return waited + wait_for_room(
            ledger, backend, host.name, booking_id, limit, settings.status_interval, say,
            gpu.snapshot if gpu is not None else None, on_wait, settings.groups,
            settings.queue_policy == "backfill", room), 0
    except KeyboardInterrupt:
        return None, signal.SIGINT
    except enginebook.Interrupted as exc:
        return None, exc.signum
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _run(
    settings: Settings, host: HostSettings, backend: CapBackend, job: JobCgroup, child: PreparedChild,
    request: RunRequest, label: str, plan: Plan, say: Callable[[str], None], gpu: GpuRun | None = None,
    watch: KernelWatch | None = None, guardian: Guardian | None = None,
) -> Outcome:
    """Let the admitted job exec, watch it to its end (``JobWatch``), then judge how it ended."""
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
    with _Signals() as signals, Foreground(child.pid) as foreground:
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
        watcher = JobWatch(settings, job, child.pid, max_runtime, signals, say, foreground, watch,
                           guardian)
        status, peak, timed_out = watcher.wait()
    result.duration_s = round(time.monotonic() - started, 3)
    job.kill_all()
    vram = watch.finish() if watch is not None else None  # the rest of its output, then the verdict
    if gpu is not None:
        result.vram_peak_bytes = gpu.vram_peak
    _judge(result, job, status, peak, timed_out, vram, say)
    if backend.name == "shared":
        _daemon_gone(result, job, say)
    if result.outcome == "exit" and result.peak_bytes:  # a killed run's profile ends early
        result.ramp = list(ramp.profile(watcher.rises, result.duration_s, result.peak_bytes))
    return result


def _daemon_gone(result: Outcome, job: JobCgroup, say: Callable[[str], None]) -> None:
    """Say so when the shared-slice daemon dropped the job's connection during the run: the booking
    was the connection's, and a daemon that starts kills every scope it finds unbooked."""
    from dispatch.capping.shared import SharedJob

    if isinstance(job, SharedJob) and job.daemon_gone():
        result.message = ("the shared-slice daemon went away during the run (it crashed or was "
                          "restarted), and with it this job's booking; a daemon that starts ends every "
                          "job it no longer books, so this one may have been killed for that")
        say(f"warning: {result.message}")


def _judge(result: Outcome, job: JobCgroup, status: int, peak: int, timed_out: bool, vram: str | None,
           say: Callable[[str], None]) -> None:
    """The ended job's verdict into ``result``, first cause first: its max runtime (253), its own cap
    (250), a full slice (254), a GPU out-of-memory (245), else its own wait status. An OOM kill or a
    GPU OOM that did not fail the job, or a machine-wide OOM kill, is said as a warning."""
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
