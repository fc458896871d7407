"""A private one-node Slurm cluster for tests: its own slurm.conf, ports, spool, munge key and daemons.

Nothing of the machine's own Slurm set-up is used or touched: every file lives in one temporary
directory, munged listens on its own socket (``AuthInfo=socket=...`` points Slurm at it) and the
controller and node daemon run as children in the foreground (``-D``) with their logs in that
directory. Tests run Slurm's commands through :meth:`SlurmCluster.run`, which exports ``SLURM_CONF``.
Jobs are capped by Slurm itself through cgroup v1 (``task/cgroup`` with ``ConstrainRAMSpace=yes``);
:meth:`SlurmCluster.stop` cancels every job, stops the daemons and reports any leftover step process
or cgroup, so a test that leaks fails.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("sinfo", "srun", "scontrol", "squeue", "scancel")
CGROUP_ROOT = Path("/sys/fs/cgroup")
MARK = "HOSTRUN_TEST_SLURM"  # in this cluster's daemons' environment: the root directory


class ClusterError(Exception):
    """The private cluster could not be started (the message says which part and why)."""


def missing_parts() -> str | None:
    """Why no private cluster can run here, or None: Slurm/munge not installed, not root, no cgroup v1."""
    absent = [d for d in DAEMONS if not os.access(d, os.X_OK)]
    absent += [c for c in CLIENTS if shutil.which(c) is None]
    if absent:
        return "Slurm is not installed (missing " + ", ".join(absent) + "; scripts/setup installs it)"
    if os.geteuid() != 0:
        return "a private Slurm cluster needs root (slurmd creates cgroups)"
    if not (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on this host now (bound to port 0, then released)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def real_memory_mb() -> int:
    """The node's RealMemory: a bit below this machine's (Slurm drains a node declaring more than it has)."""
    with open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(int(line.split()[1]) / 1024 * 0.9)
    raise ClusterError("no MemTotal in /proc/meminfo")


class SlurmCluster:
    """One controller + one node daemon + munged, all in ``root``; start() and stop() bracket a test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.cluster = "hr" + str(os.getpid())
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.started_in = 0.0  # seconds from the first daemon start to the node showing idle
        self.had_cgroups: set[Path] = set()  # Slurm's hierarchies already there before start()
        # What marks this cluster's own processes and jobs, so tear-down touches nothing else on the
        # machine (another user's or another session's Slurm): its daemons' environment carries
        # MARK (slurmstepd inherits slurmd's), and its job ids start at a number of its own.
        self.mark = f"{MARK}={root}"
        self.first_job = 1_000_000 + (os.getpid() % 60_000) * 1_000

    # --- set-up -----------------------------------------------------------------------------------
    def write_config(self) -> None:
        """slurm.conf + cgroup.conf with every path inside ``root``; a fresh munge key (0400)."""
        for sub in ("state", "spool", "log", "run", "munge"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ctld_port, d_port = free_ports(2)
        cpus = os.cpu_count() or 1
        r = self.root
        self.conf.write_text(
            f"""# private one-node test cluster (tests/support/slurmcluster.py)
ClusterName={self.cluster}
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
FirstJobId={self.first_job}
SlurmdSpoolDir={r}/spool
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
JobAcctGatherFrequency=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=300
DefMemPerNode=256
KillWait=2
InactiveLimit=0
OverTimeLimit=0
MpiDefault=none
LaunchParameters=enable_nss_slurm
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={real_memory_mb()} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""",
            encoding="utf-8",
        )
        (self.root / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=no\n"
            "ConstrainRAMSpace=yes\nConstrainSwapSpace=no\nAllowedRAMSpace=100\n",
            encoding="utf-8",
        )

    def start(self, timeout: float = 30.0) -> None:
        """Write the config, start munged, slurmctld, slurmd; wait (bounded) for the node to be idle."""
        self.write_config()
        self.had_cgroups = set(self.slurm_cgroups())
        t0 = time.monotonic()
        r = self.root
        self._spawn("munged", ["/usr/sbin/munged", "-F", "-f", f"--socket={self.munge_socket}",
                               f"--key-file={r}/munge/munge.key", f"--log-file={r}/log/munged.log",
                               f"--pid-file={r}/run/munged.pid", f"--seed-file={r}/munge/seed"])
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged did not open its socket")
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["/usr/sbin/slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(self._node_idle, timeout, "the node did not become idle")
        self.started_in = time.monotonic() - t0

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")  # the child keeps its own copy
        with out:
            self.procs[name] = subprocess.Popen(argv, env={**self.env, MARK: str(self.root)}, stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name} exited with {proc.returncode}: {self.log_tail(name)}")
            if ready():  # type: ignore[operator]
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} within {timeout:.0f} s: {self.log_tail('slurmd')}")
            time.sleep(0.05)

    def _node_idle(self) -> bool:
        done = self.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=10)
        return done.returncode == 0 and done.stdout.split() == ["idle"]

    def log_tail(self, name: str) -> str:
        """The last lines of a daemon's log, for an error message."""
        for path in (self.root / "log" / f"{name}.log", self.root / "log" / f"{name}.out"):
            if path.exists() and path.stat().st_size:
                return " | ".join(path.read_text(errors="replace").splitlines()[-5:])
        return "(no log)"

    # --- use --------------------------------------------------------------------------------------
    def run(self, argv: list[str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (or anything) against this cluster (``SLURM_CONF`` set).

        By default in the cluster's directory, so a batch job's ``slurm-N.out`` lands there.
        """
        kw.setdefault("cwd", self.root)
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False, **kw)  # type: ignore[call-overload, no-any-return]

    def jobs(self) -> list[tuple[str, str, str]]:
        """(id, name, state) of every job slurmctld keeps, ended ones too, oldest first."""
        out = self.run(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T"]).stdout
        rows = [line.split("|") for line in out.split()]
        return sorted(((r[0], r[1], r[2]) for r in rows), key=lambda r: int(r[0]))

    def wait_for(self, name: str, state: str = "RUNNING", timeout: float = 30) -> str:
        """The id of job ``name`` once it is in ``state`` (a bounded wait: AssertionError after)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for job_id, job_name, job_state in self.jobs():
                if job_name == name and job_state == state:
                    return job_id
            time.sleep(0.1)
        raise AssertionError(f"job {name} not {state} within {timeout:g} s: {self.jobs()}")

    def slurm_cgroups(self) -> list[Path]:
        """The top cgroup slurmd makes for this node in each v1 hierarchy (``slurm_NODE``, or ``slurm``)."""
        names = ("slurm", f"slurm_{self.node}")
        return [p for p in CGROUP_ROOT.glob("*/slurm*") if p.is_dir() and p.name in names]

    def job_cgroups(self) -> list[Path]:
        """Job cgroups left under those (``uid_*/job_*``)."""
        # glob.glob, not Path.glob: slurmd removes these while the walk runs, and only glob.glob
        # treats a directory that vanished mid-walk as empty
        patterns = [f"{glob.escape(str(top))}/uid_*/job_*/" for top in self.slurm_cgroups()]
        return [Path(p) for pattern in patterns for p in glob.glob(pattern)
                if self._our_job(Path(p).name)]

    def _our_job(self, cgroup_name: str) -> bool:
        """``job_N`` with N among this cluster's ids (from ``first_job``, FirstJobId in slurm.conf)."""
        number = cgroup_name.removeprefix("job_")
        return number.isdigit() and self.first_job <= int(number) < self.first_job + 1_000

    def remove_empty_cgroups(self) -> None:
        """rmdir what slurmd made under the hierarchies it created (rmdir only ever removes empty ones)."""
        for top in self.slurm_cgroups():
            if top in self.had_cgroups:
                continue
            below = (Path(d) for d, _, _ in os.walk(top) if d != str(top))  # skips vanished directories
            for path in sorted(below, key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):  # still busy: the leak check has said so
                    path.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def step_pids(self) -> list[int]:
        """Live slurmstepd processes of this cluster (their environment carries its mark): never
        another user's or another session's, which may run on the same machine."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            name, _, rest = stat.partition(b") ")
            # a zombie has ended: it waits for pid 1 (its parent once slurmd let it go) to reap it
            if name.endswith(b"(slurmstepd") and not rest.startswith(b"Z") and self._ours(entry):
                pids.append(int(entry.name))
        return pids

    def _ours(self, proc: Path) -> bool:
        try:
            return self.mark.encode() in (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            return False

    # --- tear-down --------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Cancel every job, stop the daemons (slurmd, slurmctld, munged); return the leaks found.

        A job cancelled while slurmd is launching it can get its slurmstepd a moment later, so this
        waits (bounded) for the queue to empty and the node to leave COMPLETING before stopping slurmd,
        and again for step processes to end after; only what outlives those waits is a leak.
        """
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--quiet", "-u", "root"], timeout=15)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not self._quiet():
                time.sleep(0.1)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        # slurmstepd removes a job's freezer cgroup after the job ends, not with it: on a loaded
        # 2-core machine that once took over 10 s (CI, 2026-12-02), so 30 s before it counts as left.
        deadline = time.monotonic() + 30
        while (self.step_pids() or self.job_cgroups()) and time.monotonic() < deadline:
            time.sleep(0.1)
        leaks = [f"slurmstepd pid {p} left running" for p in self.step_pids()]
        leaks += [f"job cgroup {p} left" for p in self.job_cgroups()]
        if leaks:
            self.kill_leftovers()
        self.remove_empty_cgroups()
        return leaks

    def kill_leftovers(self) -> None:
        """SIGKILL what is left of this cluster, after a leak was reported: the processes in its job
        cgroups and its slurmstepds, by pid; nothing of another Slurm on the machine."""
        for _ in range(50):
            pids = set(self.step_pids())
            for cgroup in self.job_cgroups():
                for parent, _, files in os.walk(cgroup):  # skips directories removed mid-walk
                    if "tasks" in files:
                        with contextlib.suppress(FileNotFoundError):
                            pids.update(int(p) for p in Path(parent, "tasks").read_text().split())
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def _quiet(self) -> bool:
        """No job queued or running, the node not COMPLETING, no step process."""
        queue = self.run(["squeue", "-h", "-o", "%i"], timeout=10)
        node = self.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=10)
        return (queue.returncode == 0 and not queue.stdout.strip() and "completing" not in node.stdout
                and not self.step_pids())
