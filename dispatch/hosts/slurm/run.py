"""Run one job on a Slurm cluster through ``srun``, to its end (docs/slurm.md, "Running a job").

Order of events: size ``--mem`` from the label's recorded peak on the cluster (``job.job_mem``);
start a guardian (it cancels the job if hostrun dies, even by SIGKILL); start ``srun`` with the
job's stdout passed straight through and its stderr read here, so the wrapper's one line (the job id
and the step's memory peak, ``job.MarkerFilter``) is taken out; when srun ends, read the job's
end state from Slurm (``scontrol show job`` while slurmctld keeps the record, else ``sacct``) and turn
it into hostrun's exit code; record the peak and the history row under the cluster's host name.

Signals: the first SIGINT/SIGTERM/SIGHUP/SIGQUIT is handed to the job's tasks (``scancel --signal``;
a job still pending is cancelled at once); ``kill_grace`` later, or at a second signal, the job is
cancelled (``scancel``: Slurm sends SIGTERM, then SIGKILL after its KillWait).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable

from dispatch.core.errors import ConfigError, HostrunError, NeverFitsError, NotRunError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.fdio import forward
from dispatch.core.outcome import Outcome
from dispatch.core.request import job_environment
from dispatch.core.verdicts import Verdict
from dispatch.hosts.slurm import facts as sf
from dispatch.hosts.slurm.job import (
    COMMENT_PREFIX,
    MarkerFilter,
    job_mem,
    new_token,
    srun_argv,
    submit_refusal,
    verdict,
    within_nodes,
)
from dispatch.hosts.slurm.keys import options_of
from dispatch.local.run.guardian import Watcher
from dispatch.local.run.signals import ForwardedSignals

MYPY = False
if MYPY:
    from dispatch.core.request import RunRequest
    from dispatch.hosts.base import Host, RunExtras
    from dispatch.hosts.slurm.commands import SlurmCommands
    from dispatch.hosts.slurm.login import LoginCommands

UNFINISHED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
END_STATE_WAIT = 10.0  # seconds to wait for a job's record to leave COMPLETING after srun ends
COMMAND_TIMEOUT = 10.0  # each scontrol/squeue/scancel/sacct call
STDERR_TAIL = 8192
SSH_FAILED = 255  # bytes of stderr kept to tell why Slurm refused a job


def find_job(commands: SlurmCommands, token: str) -> str | None:
    """The id of the job whose comment carries ``token`` (``squeue`` lists ended jobs too with
    ``--states=all``, while slurmctld keeps them), or None."""
    done = commands.run(["squeue", "--me", "--noheader", "--states=all", "--format=%i|%k"],
                        timeout=COMMAND_TIMEOUT)
    wanted = COMMENT_PREFIX + token
    for line in done.stdout.splitlines():
        job_id, _, comment = line.partition("|")
        if comment.strip() == wanted:
            return job_id.strip()
    return None


def end_state(commands: SlurmCommands, job_id: str) -> tuple[str | None, int, sf.JobRecord | None]:
    """The job's end state and signal, read from ``scontrol`` while slurmctld keeps the record
    (waiting, bounded, for it to leave COMPLETING), else from ``sacct`` where accounting exists."""
    deadline = time.monotonic() + END_STATE_WAIT
    record = None
    while True:
        record = sf.parse_job(commands.run(sf.job_command(job_id), timeout=COMMAND_TIMEOUT).stdout)
        if record is None or record.state not in UNFINISHED or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if record is not None:
        return record.state, record.exit_signal, record
    done = commands.run(sf.accounting_command(job_id), timeout=COMMAND_TIMEOUT)
    if done.returncode != 0:
        return None, 0, None
    steps = [s for s in sf.parse_accounting(done.stdout) if s.job_id == job_id]
    if not steps:
        return None, 0, None
    return steps[0].state, steps[0].exit_signal, None


class SlurmGuardian(Watcher):
    """A forked watcher (``dispatch.local.run.guardian.Watcher``): when hostrun dies it kills srun and
    cancels the job found by its token, so nothing is left running."""

    @classmethod
    def start(cls, commands: SlurmCommands, token: str) -> SlurmGuardian:
        return cls(*cls.fork([], lambda lines: _cancel_left(lines, commands, token)))

    def srun_started(self, pid: int) -> None:
        self.tell(f"P{pid}")


def _cancel_left(lines: list[bytes], commands: SlurmCommands, token: str) -> None:  # pragma: no cover
    srun = next((int(line[1:]) for line in lines if line.startswith(b"P")), None)
    if srun is not None:
        try:
            os.kill(srun, signal.SIGKILL)  # srun gone, Slurm ends the step at once
        except ProcessLookupError:
            pass
    for _ in range(3):  # a job still pending outlives its srun: cancel it by its token
        try:
            job_id = find_job(commands, token)
        except HostrunError:
            job_id = None
        if job_id is not None:
            commands.run(["scancel", job_id], timeout=COMMAND_TIMEOUT)
            return
        time.sleep(0.5)


class SlurmRun:
    def __init__(self, host: Host, commands: SlurmCommands, request: RunRequest,
                 say: Callable[[str], None], extras: RunExtras) -> None:
        self.host = host
        self.options = options_of(host.table)
        self.config = host.settings
        self.request = request
        self.say = say
        self.extras = extras
        self.commands = commands
        self.token = new_token()
        self.job_id: str | None = None
        self.ran = False  # the wrapper reported: the job ran on a node
        self.refused = False  # Slurm refused the job at submission: nothing ran, nothing to record
        self.no_directory = False  # the node lacks the job's directory: the wrapper ran nothing
        self.no_command = False  # the node has no such command: the wrapper ran nothing
        self.job_status: int | None = None  # the job's exit status as the node's wrapper saw it
        self.ran_for: float | None = None  # how long it ran there, by the node's clock
        self.directory = "."  # the job's directory (here, or on the login node)
        self.tree = self.rel_cwd = self.remote_tree = ""  # login-node mode: what was synced where

    @property
    def where(self) -> str:
        return f"cluster {self.host.name}"

    def _label(self) -> str:
        from dispatch.local.admission.booking import default_label

        return self.request.label or default_label(self.request.argv)

    def _worst_peak(self, label: str) -> int | None:
        """The label's worst recorded peak on this cluster, from this machine's ledger."""
        from dispatch.local.admission.ledger import Ledger

        ledger = Ledger(self.config.state_dir)
        try:
            record = ledger.peak(label, self.host.name)
        finally:
            ledger.close()
        return record.max_peak if record is not None else None

    def _nodes(self) -> list[sf.SlurmNode] | None:
        """The nodes a job of this host may run on (its ``partition``'s, when set); None when they
        cannot be read (the job is sent as it is: Slurm then says what it can hold)."""
        try:
            done = self.commands.run(sf.node_command(), timeout=COMMAND_TIMEOUT)
        except HostrunError:
            return None
        if done.returncode != 0:
            return None
        nodes = sf.parse_nodes(done.stdout)
        part = self.options.partition
        mine = [n for n in nodes if not part or not n.partitions or part in n.partitions]
        return mine or None

    def _check_nodes(self, nodes: list[sf.SlurmNode], threads: int) -> None:
        """Refuse (243) before anything is synced or submitted what no node could ever start:
        Slurm would keep it pending for good (more CPUs than a node has) or refuse it with a line
        hostrun would not know (a GPU on a cluster without one)."""
        most = max(n.cpus for n in nodes)
        if threads > most:
            raise NeverFitsError(f"{threads} threads (--threads, else heavy_threads): no node of "
                                 f"{self.where} has more than {most} CPUs; it could never start")
        if self.request.gpu_memory and not any(n.gpus for n in nodes):
            raise NeverFitsError(f"--gpu-memory: no node of {self.where} has a GPU; it could "
                                 "never start")

    def run(self) -> Outcome:
        """The job, after the script's preflight headers where it declares any (checked here: the
        tree's admission and single-instance lock; conditions about the node refuse, 78)."""
        from dispatch.guards.headers import declares_preflight

        if declares_preflight(self.request.argv):
            from dispatch.local.run.localrun import with_preflight

            return with_preflight(self.config, self.request, self.say, self._run, elsewhere=self.where)
        return self._run()

    def _run(self) -> Outcome:
        request, settings = self.request, self.host.table
        if not request.argv:
            raise NotRunError("no command to run")
        conf = self.options.slurm_conf
        # Slurm's clients retry a missing file for 60 s: say it now (on a login node, before the sync)
        if conf and not self.commands.remote and not os.path.isfile(conf):
            raise ConfigError(f"hosts.{self.host.name}.slurm_conf: {conf}: no such file; nothing ran")
        if conf and self.commands.remote and self.commands.run(["test", "-f", conf],
                                                               timeout=COMMAND_TIMEOUT).returncode:
            raise ConfigError(f"hosts.{self.host.name}.slurm_conf: {conf}: no such file on the login "
                              "node; nothing ran")
        label = self._label()
        cap, kind = job_mem(request.cap, self._worst_peak(label) if request.cap is None else None,
                            settings.default_cap)
        threads = request.threads or settings.heavy_threads or 1
        nodes = self._nodes() if kind == "peak" or threads > 1 or request.gpu_memory else None
        if nodes is not None:
            self._check_nodes(nodes, threads)
            if kind == "peak" and cap is not None:
                cap, cut = within_nodes(cap, max(n.real_memory for n in nodes) or None)
                if cut is not None:
                    self.say(f"{self.where}: {cut}")
        max_runtime = request.max_runtime or settings.max_runtime
        if request.group or request.when_idle or request.requeue:
            self.say(f"{self.where}: --group, --when-idle and --requeue are queue policies of "
                     "hostrun's own ledger; a cluster's queue is Slurm's: they have no effect there")
        from dispatch.hosts.ssh.remotetree import current_directory

        directory: str | None = current_directory()
        if self.commands.remote:
            directory = self._sync()
        elif self.extras.returns or self.extras.tree:
            self.say(f"{self.where}: the job runs in this directory on the shared filesystem: "
                     "--tree and --return have nothing to sync")
        argv = srun_argv(request, self.options, label=label, token=self.token, cap=cap,
                         threads=threads, max_runtime=max_runtime,
                         cwd=None if self.commands.remote else directory, stdin=self.extras.stdin)
        # Here srun hands the job our environment; a login node's session has its own, so only
        # hostrun's thread variables go along.
        base = {} if self.commands.remote else (request.env if request.env is not None else os.environ)
        env = job_environment(dict(base), threads, request.threads is not None or self.commands.remote)
        self.directory = directory or "."
        outcome = Outcome(exit_code=0, outcome="exit", host=self.host.name, label=label,
                          argv=list(request.argv), cap_bytes=cap, booking_kind=kind, booked_bytes=cap,
                          backend="slurm")
        guardian = SlurmGuardian.start(self.commands, self.token)
        try:
            started = time.monotonic()
            srun_status, stderr_tail, interrupted, peak = self._srun(argv, env, guardian)
            outcome.duration_s = time.monotonic() - started
            judged = self._judge(srun_status, stderr_tail, interrupted, outcome)
        finally:
            guardian.dismiss()
        outcome.exit_code, outcome.outcome, outcome.message = judged[:3]
        for line in judged.warnings:  # as locally: the job's 0 stands, its label is marked
            self.say(f"warning: {line}")
        if outcome.is_verdict(ExitCode.OWN_CAP) or judged.warnings:  # Slurm's OOM
            outcome.hit_ceiling = True
            outcome.counters = {"oom_kill": 1}
            peak = max(peak or 0, outcome.cap_bytes or 0) or peak
        outcome.peak_bytes = peak
        if self.job_id is not None and not self.refused:
            self._record(outcome, kind)
            self._alert(outcome)
            if self.commands.remote and self.extras.returns:
                self._bring_back(outcome)
        return outcome

    def _alert(self, outcome: Outcome) -> None:
        """A job killed at its --mem raises the alert a peer's would (the command again with the
        cap the half rule suggests)."""
        from dispatch.local import alertlog

        alertlog.write(self.config.alerts_path, alertlog.for_outcome(
            outcome, self.request.session, peer=self.host.name, request=self.request), self.say)

    def _sync(self) -> str:
        """Login-node mode: the tree to its work directory there; the job's directory in it."""
        from dispatch.hosts.ssh.remotetree import job_place, work_claim

        self.tree, self.rel_cwd = job_place(self.extras.tree)
        self.remote_tree = self._login().sync(self.tree, self.config.sync_excludes,
                                              work_claim(self.tree, self.request.session))
        return os.path.join(self.remote_tree, self.rel_cwd)

    def _login(self) -> LoginCommands:
        from dispatch.hosts.slurm.login import LoginCommands

        assert isinstance(self.commands, LoginCommands)
        return self.commands

    def _bring_back(self, outcome: Outcome) -> None:
        """``--return`` paths, even after a failed job; a failure after a success is 252."""
        if self._login().bring_back(self.extras.returns, os.path.join(self.remote_tree, self.rel_cwd),
                                    os.path.join(self.tree, self.rel_cwd), self.say):
            from dispatch.hosts.ssh.remotetree import returns_failed

            returns_failed(outcome)

    def _srun(self, argv: list[str], env: dict[str, str], guardian: SlurmGuardian
              ) -> tuple[int, bytes, int | None, int | None]:
        """Run srun to its end: (its status, the end of the job's stderr, the signal that
        interrupted it or None, the peak the wrapper reported or None)."""
        with ForwardedSignals() as signals:  # before srun starts: a Ctrl-C now must still cancel the job
            proc = self.commands.start(argv, env, self.directory, self.extras.stdin)
            try:
                return self._follow(proc, signals, guardian)
            finally:
                if proc.poll() is None:  # left early (an error): srun gone, Slurm ends the step
                    proc.kill()
                    proc.wait()

    def _follow(self, proc: subprocess.Popen[bytes], signals: ForwardedSignals, guardian: SlurmGuardian
                ) -> tuple[int, bytes, int | None, int | None]:
        """Forward srun's stderr (less the wrapper's line) and signals until srun ends."""
        guardian.srun_started(proc.pid)
        assert proc.stderr is not None
        marker = MarkerFilter(self.token)
        tail = b""
        interrupted: int | None = None
        cancel_at: float | None = None
        status_at = time.monotonic() + self.config.status_interval
        fd = proc.stderr.fileno()
        while True:
            if marker.line is None and interrupted is None and time.monotonic() >= status_at:
                status_at = time.monotonic() + self.config.status_interval
                self._say_pending()
            if signals.pending:
                sig = signals.pending.pop(0)
                if interrupted is None:
                    interrupted = sig
                    cancel_at = time.monotonic() + self.config.kill_grace
                    self._signal_job(sig)
                else:
                    cancel_at = time.monotonic()
            if cancel_at is not None and time.monotonic() >= cancel_at:
                cancel_at = None
                self._cancel()
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except InterruptedError:
                continue
            if not data:
                break
            out = marker.feed(data)
            if out:
                forward(2, out)
                tail = (tail + out)[-STDERR_TAIL:]
        rest = marker.finish()
        if rest:
            forward(2, rest)
            tail = (tail + rest)[-STDERR_TAIL:]
        status = proc.wait()
        proc.stderr.close()
        job_id, peak = marker.reported()
        self.job_id = job_id or self.job_id
        self.no_directory = marker.no_directory
        self.no_command = marker.no_command
        self.job_status = marker.status
        self.ran_for = marker.ran_for
        self.ran = marker.line is not None and not (self.no_directory or self.no_command)
        return status, tail, interrupted, peak

    def _signal_job(self, sig: int) -> None:
        """Hand ``sig`` to the job's tasks; a job not running yet is cancelled instead (``scancel
        --signal`` on a pending job waits for it to start)."""
        job_id = self._job_id()
        if job_id is None:
            return
        name = signal.Signals(sig).name
        try:
            state = self.commands.run(["squeue", "--noheader", "--format=%T", "--jobs", job_id],
                                      timeout=COMMAND_TIMEOUT).stdout.strip()
            if state != "RUNNING":
                self.say(f"{name}: cancelling Slurm job {job_id} on {self.where} "
                         f"({state.lower() or 'ended'})")
                self.commands.run(["scancel", job_id], timeout=COMMAND_TIMEOUT)
                return
            self.say(f"{name} to Slurm job {job_id} on {self.where}; cancelled in "
                     f"{self.config.kill_grace:g} s unless it ends")
            done = self.commands.run(["scancel", "--signal", name.removeprefix("SIG"), job_id],
                                     timeout=COMMAND_TIMEOUT)
            if done.returncode != 0:
                self.commands.run(["scancel", job_id], timeout=COMMAND_TIMEOUT)
        except HostrunError as exc:
            self.say(f"warning: could not signal Slurm job {job_id}: {exc}")

    def _cancel(self) -> None:
        job_id = self._job_id()
        if job_id is None:
            return
        try:
            self.commands.run(["scancel", job_id], timeout=COMMAND_TIMEOUT)
        except HostrunError as exc:
            self.say(f"warning: could not cancel Slurm job {job_id}: {exc}")

    def _say_pending(self) -> None:
        """While the job waits in Slurm's queue, say why, every ``status_interval`` (as a local
        waiter's line does); nothing once it runs, or when it cannot be read."""
        job_id = self._job_id(quiet=True)
        if job_id is None:
            return
        try:
            record = sf.parse_job(self.commands.run(sf.job_command(job_id),
                                                    timeout=COMMAND_TIMEOUT).stdout)
        except HostrunError:
            return
        if record is not None and record.state == "PENDING":
            self.say(f"waiting in {self.where}'s queue: {record.reason or 'no reason given'} "
                     f"(Slurm job {job_id})")

    def _job_id(self, quiet: bool = False) -> str | None:
        """The job's id, found by its token once; ``quiet``: no warning when it cannot be (the
        periodic pending line tries again next time)."""
        if self.job_id is None:
            try:
                self.job_id = find_job(self.commands, self.token)
            except HostrunError as exc:
                if not quiet:
                    self.say(f"warning: could not find the Slurm job: {exc}")
        return self.job_id

    def _split_wait(self, outcome: Outcome, run_time: float | None) -> None:
        """hostrun's wall time split into the wait in Slurm's queue and the run: by the node's
        clock as the wrapper read it; else (no reading) by Slurm's RunTime, whole seconds, so a
        wait under 1 s is not told apart; a job that never ran (cancelled pending) ran 0 s."""
        wall = outcome.duration_s or 0.0
        ran = self.ran_for if self.ran_for is not None else (
            0.0 if not self.ran and not run_time else None if run_time is None else run_time + 1.0)
        if ran is not None:
            outcome.waited_s = max(0.0, wall - ran)
            outcome.duration_s = wall - outcome.waited_s

    def _judge(self, srun_status: int, stderr_tail: bytes, interrupted: int | None,
               outcome: Outcome) -> Verdict:
        """hostrun's exit code from the job's end state (read from Slurm) and srun's status."""
        if self.no_directory:
            self.refused = True  # nothing ran: no peak, no history row
            return Verdict.of(ExitCode.NOT_RUN,
                              f"the job's directory {self.directory} does not exist on the node "
                              f"{self.where} gave it (Slurm would have run it in /tmp); nothing ran")
        if self.no_command:  # as a local run says it (the exit code of a shell's "not found")
            return Verdict(127, "exit", f"cannot run {self.request.argv[0]!r} on a node of "
                                        f"{self.where}: No such file or directory")
        if not self.ran and srun_status != 0 and interrupted is None:  # did Slurm refuse the job?
            refused = submit_refusal(stderr_tail.decode(errors="replace"), self.where)
            if refused is not None:
                self.refused = True
                return refused
        if self.job_id is None:
            try:
                self.job_id = find_job(self.commands, self.token)
            except HostrunError:
                self.job_id = None
        if self.commands.remote and srun_status == SSH_FAILED and not self.ran and interrupted is None:
            self._cancel()  # the session to the login node broke: the job must not go on alone
            return Verdict.of(ExitCode.CONNECTION_LOST,
                           f"the connection to {self.where}'s login node broke during the run; "
                           "the job was cancelled")
        if self.job_id is None:
            return verdict(None, srun_status, interrupted=interrupted, where=self.where,
                           finished=self.ran)
        try:
            state, signal_number, record = end_state(self.commands, self.job_id)
        except HostrunError as exc:
            self.say(f"warning: could not read the end of Slurm job {self.job_id}: {exc}")
            state, signal_number, record = None, 0, None
        if record is not None:
            if outcome.cap_bytes is None and record.memory:
                outcome.cap_bytes = record.memory  # the cluster's own default --mem
            self._split_wait(outcome, record.run_time)
        return verdict(state, srun_status, signal_number, interrupted, self.where, self.ran,
                       self.job_status)

    def _record(self, outcome: Outcome, kind: str | None) -> None:
        from dispatch.local.admission.ledger import Ledger
        from dispatch.local.store.ledgerdb import record_outcome

        try:
            ledger = Ledger(self.config.state_dir)
        except HostrunError as exc:  # the job has run: a ledger failure must not change its code
            self.say(f"warning: the peak and history row of this run were not recorded: {exc}")
            return
        try:
            record_outcome(self.config, ledger, outcome, self.request, outcome.cap_bytes, kind or "",
                           self.say)
        finally:
            ledger.close()


