"""``MachineHost``: the kinds whose hosts run hostrun's own runner (this machine; an ssh peer, through
its agent), so their report is a ``MachineReport`` (``dispatch.core.reportshape``): what the agent
hooks' table and ``hostrun report`` say of such a host is said here, once for both kinds."""

from __future__ import annotations

from dispatch.core.units import format_duration, format_size
from dispatch.hosts.base import Host

MYPY = False
if MYPY:
    from dispatch.core.reportshape import MachineJob, MachineReport, Report
    from dispatch.core.view import Block, Gauge
    from dispatch.hosts.judgement import HostPending, Job, Judgement
    from dispatch.local.store.ledgerdb import PeakRecord


def machine_report(report: Report) -> MachineReport:
    """A machine kind's report as what it is: its own ``report()`` built it."""
    return report  # type: ignore[return-value]  # a MachineHost's reports are MachineReports


class MachineHost(Host):
    """A host running hostrun's own runner: a slice, a ledger, heavy threads."""

    def summary(self, report: Report) -> str:
        data = machine_report(report)
        load = data.get("load") or [0.0]
        slice_ = data["slice"]
        return (f"load {load[0]:.1f} on {data.get('cores', '?')} cores, "
                f"{data.get('threads_free', '?')} of {data.get('heavy_threads', '?')} heavy "
                f"threads free, memory available "
                f"{format_size(data['memory'].get('available_for_jobs'))}, "
                f"slice {format_size(slice_.get('free'))} free of {format_size(slice_.get('limit'))}, "
                f"{data.get('queue_length', 0)} queued, {len(data.get('running') or [])} running, "
                f"GPUs: {_gpus(data)}")

    def judge(self, job: Job, report: Report, waiting: HostPending | None) -> Judgement:
        """The slice rule: its slice's free room, less its queue, less the bookings still
        ``waiting`` to show (and no more than the machine has available for jobs), covers the job's
        booking at the cap it would run under there; the kind may refuse the cap
        (``cap_problem``); with ``--gpu-memory``, one GPU has that much free after pending VRAM."""
        from dispatch.core.errors import NeverFitsError
        from dispatch.hosts.judgement import HostPending, Judgement, gpu_free_after
        from dispatch.local.admission.booking import plan_booking

        data = machine_report(report)
        s = data["slice"]
        limit = int(s["limit"])
        cap = self.job_cap(job.cap, data["settings"].get("default_cap"))
        try:
            plan = plan_booking(cap=cap, peak=_peak(data), slice_limit=limit,
                                gamble_size=int(data["settings"]["gamble_size"]))
        except NeverFitsError:
            return Judgement(self.name, False, False, cap, None,
                             f"cap {format_size(cap)} is larger than its slice ({format_size(limit)})",
                             too_big=True)
        waiting = waiting or HostPending(0, {}, ())
        pending = waiting.memory
        free = int(s["free"]) - int(s.get("queued", 0)) - pending
        # The machine, not just the slice: memory used outside it can leave less than the slice's room.
        memory = data.get("memory")
        available = memory.get("available_for_jobs") if memory else None  # an older agent lacks it
        on_machine = None if available is None else int(available) - int(s.get("queued", 0)) - pending
        machine_short = on_machine is not None and on_machine < free
        if machine_short:
            assert on_machine is not None
            free = on_machine
        refused = self.cap_problem(plan.limit)
        if refused is not None:
            return Judgement(self.name, False, False, plan.size, free, refused)
        if job.gpu_memory:
            gpus = data.get("gpus") or []
            if not gpus:
                return Judgement(self.name, False, False, plan.size, free, "no GPU")
            vram = gpu_free_after(gpus, waiting)
            gpu_index = max(vram, key=lambda i: vram[i])
            best = vram[gpu_index]
            if best < job.gpu_memory:
                ever = any(int(g.get("total") or 0) >= job.gpu_memory for g in gpus)
                vpend = " after pending" if waiting.vram or waiting.vram_unplaced else ""
                return Judgement(self.name, False, ever, plan.size, free,
                                 f"needs {format_size(job.gpu_memory)} VRAM, most free on a GPU "
                                 f"{format_size(max(0, best))}{vpend}", gpu_index)
        else:
            gpu_index = None
        pend = f" (after {format_size(pending)} pending)" if pending else ""
        if machine_short:
            pend += " on the machine (less available than in its slice)"
        if free >= plan.size:
            return Judgement(self.name, True, True, plan.size, free, f"fits: {plan.kind} booking "
                             f"{format_size(plan.size)}, {format_size(free)} free{pend}", gpu_index)
        return Judgement(self.name, False, True, plan.size, free,
                         f"full: needs {format_size(plan.size)}, {format_size(max(0, free))} free{pend}",
                         gpu_index)

    def describe(self, report: Report) -> list[Block]:
        """Its memory, slice, bookings, load, heavy threads and GPUs; then its running jobs."""
        from dispatch.core import view  # not on a run's path: LocalHost is its door

        data = machine_report(report)
        s, mem = data["slice"], data["memory"]
        version = data.get("agent_version") or data["version"]
        rows = [view.row("memory", f"{format_size(mem['available'])} available of "
                                   f"{format_size(mem['total'])}")]
        if "available_for_jobs" in mem:  # an older peer's agent does not report it
            rows.append(view.row("available", f"{format_size(mem['available_for_jobs'])} (available "
                                              "less booked not yet at peak)"))
        rows += [
            view.row("slice", f"{format_size(s['limit'])} limit, {format_size(s['used'])} used "
                              f"(page cache excluded; {format_size(s['reclaimable'])} reclaimable)"),
            view.row("booked", f"{format_size(s['booked'])} ({format_size(s['booked_not_at_peak'])} "
                               f"not yet at peak); {format_size(s['free'])} free to book"),
            view.row("load", " ".join(f"{x:.2f}" for x in data["load"]) + f" on {data['cores']} cores"),
        ]
        free = f" ({data['threads_free']} free)" if "threads_free" in data else ""
        rows.append(view.row("heavy threads", f"{data['heavy_threads']}{free}"))
        for gpu in data.get("gpus") or []:
            rows.append(view.row(f"GPU {gpu.get('index', '?')}", f"{gpu.get('name', '')}: "
                                 f"{format_size(gpu.get('free'))} free of {format_size(gpu.get('total'))}"))
        rows += [view.row("running", str(len(data["running"]))),
                 view.row("queue", str(data["queue_length"]))]
        if "sessions" in data:  # an older peer's agent does not report it
            rows.append(view.row("sessions", _sessions(data)))
        engine = data.get("admission_engine")
        if engine is not None:  # ``hostrun report`` says it of this host
            rows.append(view.row("admission engine", engine["detail"] + (
                f" ({engine['socket']})" if engine["socket"] and engine["pid"] else "")))
        blocks: list[Block] = [view.Grid(
            f"host {data['host']} ({data['hostname']}), backend {data['backend']}, hostrun {version}",
            ("what", "value"), tuple(rows), header=False)]
        if data["running"]:
            columns: tuple[str, ...] = ("label", "pid", "kind", "booked", "in use", "age")
            jobs = tuple(view.row(j["label"] or "", str(j["pid"]), j["kind"], format_size(j["booked"]),
                                  format_size(j["in_use"]), format_duration(j["age_s"]))
                         for j in data["running"])
            names = view.session_names(data["running"])
            if any(j.get("role") == "session" or view.report_id(j.get("in_session")) is not None
                   for j in data["running"]):  # which runs are sessions, which session started a job
                columns += ("session",)
                jobs = tuple((*row, view.Span(_session_cell(j, data["running"], names)))
                             for row, j in zip(jobs, data["running"]))
            blocks.append(view.Grid("running jobs", columns, jobs))
        return blocks

    def gauges(self, report: Report) -> list[Gauge]:
        """Memory (used, and booked not yet at peak), the slice (used, booked), load against its
        cores with the heavy threads, the sessions slice while agent sessions run (their use and
        bookings against its limit), and each GPU's VRAM."""
        from dispatch.core import view

        data = machine_report(report)
        s, mem = data["slice"], data["memory"]
        total, available = int(mem["total"]), int(mem["available"])
        for_jobs = int(mem.get("available_for_jobs", available))  # an older peer's agent lacks it
        queued = f", {format_size(s['queued'])} queued" if s.get("queued") else ""
        load = data.get("load") or [0.0, 0.0, 0.0]
        cores = int(data.get("cores") or 1)
        free = f" ({data['threads_free']} free)" if "threads_free" in data else ""
        shown = [
            view.Gauge("memory", f"available {format_size(available)} of {format_size(total)}, "
                                 f"for jobs {format_size(for_jobs)}",
                       total - available, total - for_jobs, total),
            view.Gauge("slice", f"used {format_size(s['used'])}, booked {format_size(s['booked'])}, "
                                f"free {format_size(s['free'])} of {format_size(s['limit'])}{queued}",
                       s["used"], s["booked"], s["limit"]),
            view.Gauge("load", f"{' '.join(f'{x:.2f}' for x in load)} on {cores} cores, heavy "
                               f"threads {data.get('heavy_threads', '?')}{free}",
                       min(load[0], cores), 0, cores),
        ]
        sessions = data.get("sessions")  # an older peer's agent does not report them
        if sessions and sessions["count"]:
            shown.append(view.Gauge("sessions", f"{sessions['count']} running ({_jobs(sessions['jobs'])}), "
                                    f"used {format_size(sessions['in_use'])}, booked "
                                    f"{format_size(sessions['booked'])} of {format_size(sessions['limit'])}",
                                    sessions["in_use"], sessions["booked"], sessions["limit"]))
        if data.get("gpu_error"):
            shown.append(view.Gauge("GPUs", f"unreadable ({data['gpu_error']})"))
        for gpu in data.get("gpus") or []:
            vram, used = gpu.get("total") or 0, gpu.get("used") or 0
            shown.append(view.Gauge(f"GPU {gpu.get('index', '?')}", f"{gpu.get('name', '')}: "
                                    f"{format_size(gpu.get('free'))} free of {format_size(gpu.get('total'))}",
                                    used, 0, vram))
        return shown


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _sessions(report: MachineReport) -> str:
    """The running agent sessions in one line: how many, booked, in use, the jobs they started."""
    s = report["sessions"]
    room = f"(sessions slice {format_size(s['limit'])})"
    if not s["count"]:
        return f"none running {room}"
    return (f"{s['count']} running, {format_size(s['booked'])} booked, {format_size(s['in_use'])} "
            f"in use, {_jobs(s['jobs'])} in them {room}")


def _session_cell(job: MachineJob, running: list[MachineJob], names: dict[int | str, str]) -> str:
    """A session's own cell ("session, 2 jobs"), a job's (the session it was started in), or "-"."""
    from dispatch.core import view

    if job.get("role") == "session":
        key = view.report_id(job.get("id"))
        return f"session, {_jobs(sum(1 for j in running if key is not None and j.get('in_session') == key))}"
    inside = view.report_id(job.get("in_session"))
    return "-" if inside is None else names.get(inside, f"#{inside}")


def _peak(report: MachineReport) -> PeakRecord | None:
    from dispatch.local.store.ledgerdb import PeakRecord

    record = report.get("label_peak")
    return PeakRecord(**record) if record else None


def _gpus(report: MachineReport) -> str:
    gpus = report.get("gpus") or []
    if report.get("gpu_error"):
        return f"unreadable ({report['gpu_error']})"
    if not gpus:
        return "none"
    return ", ".join(f"{g.get('index')}: {format_size(g.get('free'))} free of {format_size(g.get('total'))}"
                     for g in gpus)
