"""A fourth host kind, written the way docs/design.md ("Where to add a host kind") says a kind is
added, and registered only by the tests: nothing in ``dispatch/`` names it.

``toy`` is a pretend machine of ``limit`` bytes whose jobs run here as plain child processes (no
cap: it is a toy), listed in a file of its own while they run so that its report shows them. It
has its own report shape (``ToyReport``), its own fit rule, its own one-line summary and its own
description for ``hostrun report``; everything else (the dispatcher, ``--host``, ``--auto``,
``report``, the agent hooks' table) asks it through the ``Host`` interface.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, cast

from dispatch.core import view
from dispatch.core.exitcodes import exec_failure, from_wait_status
from dispatch.core.hostkeys import MEMORY_SIZE, PATH, TEXT, Key, KindSpec
from dispatch.core.outcome import Outcome
from dispatch.core.reportshape import Report, Room, RoomSettings, RunningJob
from dispatch.core.request import RunRequest
from dispatch.core.units import GiB, format_size
from dispatch.hosts.base import Host, RunExtras
from dispatch.hosts.judgement import HostPending, Job, Judgement

if TYPE_CHECKING:  # a name for annotations only (dispatch.core.view)
    from dispatch.core.view import Block


class ToyJob(RunningJob):
    pid: int


class ToyReport(Report):
    """A toy's report: the shared keys, narrowed, and its queue's name."""

    kind: Literal["toy"]
    queue_name: str
    slice: Room
    settings: RoomSettings
    running: list[ToyJob]


DEFAULT_SIZE = GiB  # what a job without -m is counted as


class ToyHost(Host):
    kind = "toy"
    spec = KindSpec("toy", (
        Key("queue", "queue", TEXT, required="a toy needs queue = 'name'"),
        Key("limit", "limit", MEMORY_SIZE, env="TOY_LIMIT"),
        Key("toy_config", "toy_config", PATH),
    ))

    @property
    def limit(self) -> int:
        return int(self.table.options.get("limit") or 4 * GiB)

    @property
    def jobs_file(self) -> str:
        return os.path.join(self.settings.state_dir, f"toy-{self.name}.json")

    def _jobs(self) -> list[ToyJob]:
        try:
            with open(self.jobs_file) as fh:
                jobs: list[ToyJob] = json.load(fh)
        except FileNotFoundError:
            return []
        return [j for j in jobs if os.path.exists(f"/proc/{j['pid']}")]

    def _save(self, jobs: list[ToyJob]) -> None:
        os.makedirs(self.settings.state_dir, mode=0o700, exist_ok=True)
        with open(self.jobs_file, "w") as fh:
            json.dump(jobs, fh)

    def report(self, label: str | None = None, peaks: bool = False) -> ToyReport:
        jobs = self._jobs()
        used = sum(j["booked"] or 0 for j in jobs)
        return {"kind": "toy", "host": self.name, "hostname": None, "version": "toy", "time": time.time(),
                "queue_name": str(self.table.options["queue"]),
                "slice": {"limit": self.limit, "free": max(0, self.limit - used)},
                "settings": {"default_cap": None, "gamble_size": None},
                "running": jobs, "queue": [], "gpus": [], "queue_length": 0, "label_peak": None}

    def judge(self, job: Job, report: Report, waiting: HostPending | None) -> Judgement:
        need = job.cap or DEFAULT_SIZE
        free = report["slice"]["free"] - (waiting.memory if waiting else 0)
        if need > self.limit:
            return Judgement(self.name, False, False, need, free,
                             f"{format_size(need)} is more than the toy's {format_size(self.limit)}",
                             too_big=True)
        fits = free >= need
        return Judgement(self.name, fits, True, need, free,
                         f"toy {'fits' if fits else 'full'}: {format_size(free)} free")

    def run(self, request: RunRequest, say: Callable[[str], None], extras: RunExtras) -> Outcome:
        label = request.label or os.path.basename(request.argv[0])
        argv = list(request.argv)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(argv, env=request.env)
        except (OSError, ValueError) as exc:
            code, why = exec_failure(exc)
            return Outcome(exit_code=code, outcome="exit", host=self.name, label=label, argv=argv,
                           message=f"{argv[0]}: {why}")
        self._save([*self._jobs(), {"id": proc.pid, "pid": proc.pid, "label": label,
                                    "booked": request.cap or DEFAULT_SIZE, "age_s": 0.0}])
        try:
            _, status = os.waitpid(proc.pid, 0)
            proc.returncode = 0  # reaped here: Popen must not wait for it again
        finally:
            self._save([j for j in self._jobs() if j["pid"] != proc.pid])
        code, outcome = from_wait_status(status)  # the job's own status passes through
        return Outcome(exit_code=code, outcome=outcome, host=self.name, label=label, argv=argv,
                       cap_bytes=request.cap, duration_s=time.monotonic() - started)

    def summary(self, report: Report) -> str:
        return (f"toy queue {cast(ToyReport, report)['queue_name']}, "
                f"{format_size(report['slice']['free'])} free of {format_size(report['slice']['limit'])}, "
                f"{len(report['running'])} running")

    def describe(self, report: Report) -> list[Block]:
        rows = tuple(view.row(str(j["label"]), str(j["booked"])) for j in report["running"])
        room = report["slice"]
        return [view.line(view.Span(self.name, view.BOLD),
                          f": a toy with {format_size(room['free'])} free of {format_size(room['limit'])}"),
                view.Grid(f"jobs on {self.name}", ("label", "booked"), rows, empty="no jobs")]
