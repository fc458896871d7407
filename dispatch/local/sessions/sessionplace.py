"""A running agent session placed under the budget without the wrapper (``hostrun session``).

``hostrun agents install claude-code`` installs a SessionStart hook; at a session's start (or resume)
it starts a process of its own for it, detached (``dispatch.hooks.placer``), for the client's
process (``agent_process``: the nearest ancestor of the hook that is not a shell). That process then
does what ``hostrun session`` does around a command it starts itself, for a process tree that is
already running:

1. books the session (label ``session:NAME``, its cap from ``agentsession.session_cap``, its first
   booking ``[sessions] first_booking``) and waits its turn; the session runs on meanwhile, outside
   the sessions slice (it cannot be held back: it has started);
2. once admitted, makes the session's cgroup in the sessions slice and moves the client's process
   tree into it (``JobCgroup.take``: a write to ``cgroup.procs`` on cgroup v1/v2, a scope started
   around the processes with systemd); what they start later is born inside;
3. watches it: its peak sampled, the whole session ended once one of its processes was killed at
   its cap (as ``JobWatch`` does for ``hostrun session``); when the client's process ends, what is
   left in the cgroup (an MCP server, a tool) is ended too;
4. records the peak and history row, releases the booking, removes the cgroup, and alerts a kill at
   its cap with the command that resumes it.

The booking is held by this process's connection to the admission engine: if this process dies
(or the client ends before it was admitted) the booking goes with it. Where the platform cannot
place the session (the ``none`` backend, a shared slice, cgroup v2 without a writable common parent,
a systemd user manager asked for processes outside its subtree) the SessionStart hook says so once,
in the session's context, and the session runs as before.
"""

from __future__ import annotations

import os
import time

from dispatch.core.errors import HostrunError

MYPY = False
if MYPY:
    from collections.abc import Callable

    from dispatch.capping.base import CapBackend, JobCgroup
    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import Settings
    from dispatch.local.engine.admitclient import Link

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "fish", "ksh", "env", "timeout"})
ALREADY = "already under hostrun (a session's or a job's cgroup)"  # placeable: nothing to say
SAMPLE_EVERY = 1.0  # seconds: the session's peak and its OOM check while it runs


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, uid) of ``pid``, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    comm = data[data.index(b"(") + 1:data.rindex(b")")].decode("utf-8", "replace")
    return comm, int(data[data.rindex(b")") + 2:].split()[1]), uid


def agent_process(start: int | None = None) -> int | None:
    """The agent's process: the nearest ancestor of ``start`` (this process's parent) that is not a
    shell or an interpreter running the hook, and is this user's; None when there is none."""
    pid = os.getppid() if start is None else start
    me = os.getuid()
    for _ in range(16):
        found = _stat(pid)
        if found is None or pid <= 1 or found[2] != me:
            return None
        if found[0] not in SHELLS:
            return pid
        pid = found[1]
    return None


def tree(pid: int, skip: str = "") -> list[int]:
    """``pid`` and every process below it (read from ``/proc``), but those whose cgroup path holds
    ``skip`` (the slice: a job already running in its own job cgroup stays under its own cap)."""
    from dispatch.local.sessions.sessionties import holder_cgroup

    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                children.setdefault(found[1], []).append(int(name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        if not (skip and skip in (holder_cgroup(current) or "")):
            out.append(current)
        todo += children.get(current, [])
    return out


def slice_path(backend: CapBackend) -> str:
    """The slice's cgroup path as ``/proc/PID/cgroup`` names it ("" for a backend without one)."""
    return getattr(backend, "slice_path", "")


def placeable(settings: Settings, pid: int) -> str | None:
    """Why the agent ``pid`` cannot be placed here (one line), or None: a backend that runs sessions,
    and a process not already in a session's or a job's cgroup."""
    from dispatch.local.hostslice import LocalSlice
    from dispatch.local.sessions.sessionties import holder_cgroup

    backend = LocalSlice(settings).backend
    if backend.session_form is None:
        return (f"the {backend.name} memory-cap backend here runs no agent sessions; this session "
                "runs outside hostrun's sessions slice")
    own = holder_cgroup(pid)
    if own is None:
        return "the agent's process is gone"
    inside = slice_path(backend)
    if inside and inside in own:
        return ALREADY
    problem = backend.take_problem(own)
    if problem is not None:
        return f"this session cannot be placed in hostrun's sessions slice: {problem}"
    return None


def place(settings: Settings, pid: int, label: str, say: Callable[[str], None]) -> int:
    """Book, move in, watch, record and release agent ``pid``'s session (module docstring); the exit
    code it would have: 250 killed at its cap, 254 the slice or sessions slice full, else 0."""
    import threading

    from dispatch.core.exitcodes import ExitCode
    from dispatch.core.procinfo import start_time
    from dispatch.core.request import RunRequest
    from dispatch.local.engine import enginebook
    from dispatch.local.hostslice import LocalSlice
    from dispatch.local.sessions.agentsession import session_cap, session_label

    started = start_time(pid)
    pidfd = os.pidfd_open(pid)  # from now on this agent, even if its pid is reused
    argv = _cmdline(pid)
    here = LocalSlice(settings)
    label = session_label(argv, label)
    cap, why = session_cap(settings, here, label, None)
    from dispatch.core.units import format_size

    say(f"placing {label} (pid {pid}, started {started}): cap {format_size(cap)} ({why})")
    request = RunRequest(argv=argv, label=label, cap=cap, role="session")

    def agent_ended_first() -> None:  # while booked and waiting: its connection closes with us
        import select

        select.select([pidfd], [], [])
        if not placed.is_set():
            say(f"{label}: the agent ended before it was admitted; nothing placed")
            os._exit(0)

    placed = threading.Event()
    threading.Thread(target=agent_ended_first, daemon=True).start()
    booked = enginebook.book(settings, request, label, False, None, say, None)
    placed.set()
    import signal

    signal.pthread_sigmask(signal.SIG_SETMASK, booked.mask)  # held back while it waited: no longer
    from dispatch.core.outcome import Outcome
    from dispatch.local.admission.booking import Plan

    plan = Plan(*booked.plan)
    outcome = Outcome(exit_code=0, outcome="exit", host=here.host.name, label=label, argv=argv,
                      cap_bytes=cap, booking_kind=plan.kind, booked_bytes=plan.size,
                      backend=here.backend.name)
    job = None
    try:
        here.backend.ensure_slice(here.limit)
        here.backend.ensure_sessions(settings.sessions.limit(here.limit))
        me = os.getpid()
        holder = f"{me}-{start_time(me) or 0}"
        job = here.backend.create_session(holder, cap, settings.sessions.high_mark(cap))
        job.held_by(booked.link)
        outcome.cgroup = job.path
        inside = slice_path(here.backend)
        job.take([p for p in tree(pid, inside) if p != me])  # this process may be the hook's child
        try:  # those forked while the first ones were moved (the rest are born inside)
            job.take([p for p in tree(pid, inside) if p != me])
        except HostrunError as exc:
            say(f"{label}: some of its processes could not be moved in: {exc}")
        say(f"{label}: placed in {job.path}")
        began = time.monotonic()
        peak = _watch(job, pidfd)
        job.kill_all()  # what it left running (an MCP server, a tool) ends with it
        verdict = job.oom_evidence()
        outcome.duration_s = round(time.monotonic() - began, 3)
        outcome.peak_bytes = max(peak, job.peak_estimate(), job.charged_peak() if verdict.own else 0)
        outcome.hit_ceiling = verdict.own
        outcome.counters = verdict.counters
        if verdict.own:
            outcome.mark(ExitCode.OWN_CAP)
        elif verdict.slice_full:
            outcome.mark(ExitCode.SLICE_FULL)
        _record(settings, booked.link, outcome, request, cap, plan.kind, here.limit, say)
        return int(outcome.exit_code)
    finally:
        try:
            booked.link.release()
        except HostrunError as exc:
            say(f"{label}: could not release its booking: {exc}")
        booked.link.close()
        if job is not None:
            try:
                job.remove()
            except OSError as exc:
                say(f"{label}: could not remove {job.path}: {exc.strerror}")
        os.close(pidfd)


def _watch(job: JobCgroup, pidfd: int) -> int:
    """Until the agent's process ends: its session's peak, sampled; the whole session ended once a
    process of it was killed at its cap."""
    import select

    peak = 0
    ending = False
    while not select.select([pidfd], [], [], SAMPLE_EVERY)[0]:
        peak = max(peak, job.sample())
        if not ending and job.oom_evidence().own:
            job.kill_all()
            ending = True
    return max(peak, job.sample())


def _record(settings: Settings, link: Link, outcome: Outcome, request: RunRequest, cap: int, kind: str,
            slice_limit: int, say: Callable[[str], None]) -> None:
    """The peak and history row (carried by the release), and the alert of a kill."""
    from dispatch.core.exitcodes import ExitCode
    from dispatch.local import alertlog
    from dispatch.local.store.runrecord import record_outcome

    record_outcome(settings, link, outcome, request, cap, kind, say)
    if outcome.is_verdict(ExitCode.OWN_CAP, ExitCode.SLICE_FULL):
        alert = alertlog.for_outcome(outcome, None, slice_limit=slice_limit, request=request)
        if alert is not None:
            alertlog.write(settings.alerts_path, alert, say)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return ["agent"]
    return [w.decode("utf-8", "surrogateescape") for w in words if w] or ["agent"]
