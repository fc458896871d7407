"""systemd transient scopes: each job in ``hostrun-job-<id>.scope`` inside the slice unit, asked for
over D-Bus (``dispatch.capping.dbus``); its counters read from the cgroup v2 files.

Used when systemd is PID 1: it owns the cgroup tree, and writing to it behind its back is not allowed.
root talks to the system manager (``/run/systemd/private``); a normal user to their own user manager
(``$XDG_RUNTIME_DIR/systemd/private``), whose subtree ``user@UID.service`` every current distribution
delegates the memory controller to, so the slice is ``…/user@UID.service/hostrun.slice``.

Why a *keeper*: systemd removes a scope's cgroup as soon as its last process is gone, and with it the
counters that say whether the job died at its own cap (250) or because the slice was full (254) and
its high-water mark. So every scope is started holding two processes: the job's (forked and waiting,
as with the direct backends) and a keeper, a ``cat`` reading a pipe only hostrun writes to. The
scope outlives the job until hostrun has read the counters and closes the pipe; if hostrun dies, the
pipe closes too, so the keeper never outlives it. The keeper ignores the stop signals (systemd's
``OOMPolicy=stop`` sends SIGTERM to the whole scope), sits in its own session, and is never the OOM
killer's choice as root (``oom_score_adj`` -1000). The counters are also remembered at each sample, so
a scope that systemd stops anyway (``TimeoutStopSec`` after an OOM, the keeper killed) still gives the
verdict seen last.
"""

from __future__ import annotations

import os
import signal
import time

from dispatch.capping.base import OomEvidence, Probe, SessionForm, read_keyed, read_pids, read_text
from dispatch.capping.cgroup2 import Cgroup2Backend, Cgroup2Job
from dispatch.capping.cgroupfs import parse_mountinfo, read_self_files
from dispatch.core.errors import BackendError
from dispatch.core.exitcodes import NOT_FOUND

MYPY = False
if MYPY:
    from dispatch.capping.dbus import Connection

SLICE_UNIT = "hostrun.slice"
SYSTEM_MANAGER = "/run/systemd/private"
KEEPER_NAME = "hostrun-scope-keeper"
START_TIMEOUT = 30.0  # a start job on a busy (or emulated) machine can take seconds


def _pid1_is_systemd(proc_root: str = "/proc") -> bool:
    try:
        with open(os.path.join(proc_root, "1", "comm"), encoding="utf-8") as fh:
            return fh.read().strip() == "systemd"
    except OSError:
        return False


def slice_cgroup_path(unit: str) -> str:
    """Where systemd puts a slice unit in the cgroup tree: a dash nests (systemd.slice(5)), so
    ``hostrun.slice`` is ``/hostrun.slice`` and ``hostrun-jobs.slice`` is
    ``/hostrun.slice/hostrun-jobs.slice``."""
    parts = unit[: -len(".slice")].split("-")
    return "".join("/" + "-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def _valid_slice_unit(unit: str) -> bool:
    name = unit[: -len(".slice")] if unit.endswith(".slice") else ""
    return bool(name) and "/" not in unit and all(name.split("-"))


class Manager:
    """Which systemd manager hostrun talks to: its socket, whether it is a bus, and the cgroup its
    units live under ("" for the system manager, ``/user.slice/user-UID.slice/user@UID.service`` for
    a user's). One connection, opened on first use and kept for the run."""

    def __init__(self, socket_path: str, root_cgroup: str, user: bool, bus: bool = False) -> None:
        self.socket_path = socket_path
        self.root_cgroup = root_cgroup
        self.user = user
        self.bus = bus
        self._conn: Connection | None = None

    @property
    def label(self) -> str:
        return "the user manager" if self.user else "the system manager"

    def connection(self) -> Connection:
        if self._conn is None:
            from dispatch.capping.dbus import Connection

            self._conn = Connection(self.socket_path, bus=self.bus)
            self._conn.manager("Subscribe")
            if self.bus:
                self._conn.call("/org/freedesktop/DBus", "org.freedesktop.DBus", "AddMatch", "s",
                                ("type='signal',sender='org.freedesktop.systemd1',"
                                 "interface='org.freedesktop.systemd1.Manager',member='JobRemoved'",),
                                destination="org.freedesktop.DBus")
        return self._conn

    def start(self, unit: str, properties: list[tuple[str, tuple[str, object]]] | None = None) -> None:
        """Start ``unit`` (a transient one when ``properties`` are given) and wait for its start job."""
        conn = self.connection()
        if properties is None:
            (job,) = conn.manager("StartUnit", "ss", unit, "fail")
        else:
            (job,) = conn.manager("StartTransientUnit", "ssa(sv)a(sa(sv))", unit, "fail", properties, [])
        done = conn.wait_signal("JobRemoved", job, START_TIMEOUT)
        result = done.body[3] if len(done.body) > 3 else "?"
        if result != "done":
            raise BackendError(f"{self.label} could not start {unit} (start job: {result})")

    def attach(self, unit: str, pids: list[int]) -> None:
        """Move running processes into ``unit`` (a scope already started): systemd 238 and later."""
        self.connection().manager("AttachProcessesToUnit", "ssau", unit, "", pids)

    def set_properties(self, unit: str, properties: list[tuple[str, tuple[str, object]]]) -> None:
        self.connection().manager("SetUnitProperties", "sba(sv)", unit, True, properties)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def find_manager(euid: int | None = None,
                 environ: dict[str, str] | None = None) -> tuple[Manager | None, str]:
    """The manager a run will talk to, or None and why not. root: the system manager; anyone else:
    their own user manager, found through ``$XDG_RUNTIME_DIR`` (else ``/run/user/UID``). The socket
    must be the caller's (root's for the system manager): someone else's would be obeyed."""
    uid = os.geteuid() if euid is None else euid
    env = os.environ if environ is None else environ
    if uid == 0:
        path, root, user = SYSTEM_MANAGER, "", False
    else:
        runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
        path = os.path.join(runtime, "systemd", "private")
        # logind's fixed names (user-UID.slice in user.slice, user@UID.service): no round trip needed.
        root, user = f"/user.slice/user-{uid}.slice/user@{uid}.service", True
    try:
        st = os.stat(path)
    except OSError:
        if user:
            return None, (f"no systemd user manager for uid {uid} ({path} missing): run hostrun from a "
                          "login session, or keep the manager running with 'loginctl enable-linger'")
        return None, f"{path} missing"
    if st.st_uid != uid:
        return None, f"{path} belongs to uid {st.st_uid}, not {uid}"
    return Manager(path, root, user), f"{'user' if user else 'system'} manager at {path}"


class SystemdJob(Cgroup2Job):
    """A job scope: started when the job's process exists (``adopt``), held open by the keeper until
    ``remove``. Signals and kills spare the keeper; the counters are remembered at each sample."""

    def __init__(self, directory: str, cap: int, slice_dir: str, manager: Manager | None = None,
                 properties: list[tuple[str, tuple[str, object]]] | None = None,
                 keeper_program: str | None = None, outer: tuple[str, ...] = ()) -> None:
        super().__init__(directory, cap, slice_dir, *outer)
        self.unit = os.path.basename(directory)
        self._manager = manager
        self._properties = properties or []
        self._keeper_program = keeper_program
        self.keeper = 0
        self._keeper_fd = -1
        self._events: dict[str, int] = {}
        self._peak = 0

    def preexec(self) -> None:
        """systemd moves the waiting child into the scope (``adopt``): nothing to do in the child."""

    def adopt(self, pid: int) -> None:
        if self._manager is None:
            return
        self.keeper, self._keeper_fd = _spawn_keeper(self._keeper_program or "cat")
        props = [("PIDs", ("au", [self.keeper, pid])), *self._properties]
        try:
            self._manager.start(self.unit, props)
            cgroup = _cgroup_of(pid)
            if cgroup is not None and not self.path.endswith(cgroup):
                raise BackendError(f"the job's process is in {cgroup}, not in {self.unit}")
        except BackendError:
            self._stop_keeper()
            raise

    def take(self, pids: list[int]) -> None:
        """The scope started around processes already running (with its keeper): systemd moves them;
        once it runs, more are attached to it."""
        if self._manager is None:
            raise BackendError(f"no systemd manager to start {self.unit}")
        if self.keeper:
            self._manager.attach(self.unit, pids)
            return
        self.keeper, self._keeper_fd = _spawn_keeper(self._keeper_program or "cat")
        try:
            self._manager.start(self.unit, [("PIDs", ("au", [self.keeper, *pids])), *self._properties])
        except BackendError:
            self._stop_keeper()
            raise

    def _others(self) -> list[int]:
        return [p for p in read_pids(os.path.join(self.path, "cgroup.procs")) if p != self.keeper]

    def pids(self) -> list[int]:
        return self._others()

    def signal_all(self, sig: int) -> None:
        for pid in self._others():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self, settle: float = 5.0) -> bool:
        if not self.keeper:  # a guardian's or a reclaimer's copy: the whole scope goes
            return super().kill_all()
        deadline = time.monotonic() + settle
        while True:
            pids = self._others()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def _remember(self) -> None:
        events = read_keyed(os.path.join(self.path, "memory.events"))
        if events:
            self._events = events
        self._peak = max(self._peak, super().charged_peak())

    def sample(self) -> int:
        self._remember()
        return super().sample()

    def charged_peak(self) -> int:
        return max(self._peak, super().charged_peak())

    def oom_evidence(self) -> OomEvidence:
        self._remember()
        if not self._events:
            return super().oom_evidence()
        oom, oom_kill = self._events.get("oom", 0), self._events.get("oom_kill", 0)
        slice_oom = self._slice_oom() - self._slice_oom_before
        from dispatch.capping.cgroupdir import attribute

        return attribute(oom_kill, oom, slice_oom, {"oom": oom, "oom_kill": oom_kill, "slice_oom": slice_oom})

    def _stop_keeper(self) -> None:
        if self._keeper_fd >= 0:
            os.close(self._keeper_fd)
            self._keeper_fd = -1
        if self.keeper:
            try:
                os.waitpid(self.keeper, 0)
            except ChildProcessError:
                pass
            self.keeper = 0

    def remove(self) -> None:
        """Let the keeper go: the scope is then empty and systemd removes it (never rmdir'ed here)."""
        self.close()
        if self._manager is not None:
            self._manager.close()

    def close(self) -> None:
        self._stop_keeper()
        super().close()


def scope_properties(description: str, slice_unit: str, cap: int, grace: float
                     ) -> list[tuple[str, tuple[str, object]]]:
    """A job scope's properties (the shared slice's daemon gives its scopes the same): in the slice,
    capped with no swap, the whole scope stopped on an OOM kill (SIGTERM, SIGKILL after ``grace``),
    and collected once it is over."""
    return [
        ("Description", ("s", description)),
        ("Slice", ("s", slice_unit)),
        ("MemoryAccounting", ("b", True)),
        ("MemoryMax", ("t", cap)),
        ("MemorySwapMax", ("t", 0)),
        ("OOMPolicy", ("s", "stop")),
        ("TimeoutStopUSec", ("t", int(grace * 1_000_000))),
        ("CollectMode", ("s", "inactive-or-failed")),
    ]


def _spawn_keeper(program: str) -> tuple[int, int]:
    """Fork the keeper: ``cat`` on a pipe's read end; returns its pid and the write end."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the keeper; tested end to end in the VM
        try:
            os.setsid()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP,
                        signal.SIGTTIN, signal.SIGTTOU, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_IGN)
            os.dup2(read_fd, 0)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            try:  # root may: then never the OOM killer's choice (a container may forbid it)
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                try:
                    os.write(fd, b"-1000")
                finally:
                    os.close(fd)
            except OSError:
                pass
            os.execv(program, [KEEPER_NAME])
        finally:
            os._exit(NOT_FOUND)
    os.close(read_fd)
    return pid, write_fd


def _cgroup_of(pid: int) -> str | None:
    try:
        text = read_text(f"/proc/{pid}/cgroup")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


class SystemdBackend(Cgroup2Backend):
    name = "systemd"
    job_affixes = ("hostrun-job-", ".scope")  # the scope units create_job names

    def __init__(self, mount: str, slice_unit: str = SLICE_UNIT, manager: Manager | None = None,
                 keeper_program: str | None = None) -> None:
        root = manager.root_cgroup if manager is not None else ""
        super().__init__(mount, root + slice_cgroup_path(slice_unit))
        self.slice_unit = slice_unit
        self.manager = manager
        self.keeper_program = keeper_program
        # its sessions slice: a dash nests, so it is a child of the slice (systemd.slice(5))
        self.sessions_unit = slice_unit[: -len(".slice")] + "-sessions.slice"
        self.session_form = SessionForm(self.sessions_unit, "hostrun-session-", ".scope")

    @classmethod
    def probe(
        cls, configured_slice: str | None = None, files: tuple[str, str] | None = None, *,
        proc_root: str = "/proc", euid: int | None = None, environ: dict[str, str] | None = None,
    ) -> tuple[Probe, SystemdBackend | None]:
        if not _pid1_is_systemd(proc_root):
            return Probe(False, "systemd is not PID 1"), None
        try:
            mount = parse_mountinfo((files or read_self_files())[1]).get("cgroup2")
        except OSError as exc:
            return Probe(False, f"cannot read /proc/self: {exc}"), None
        if not mount:
            return Probe(False, "systemd without a unified cgroup2 hierarchy"), None
        try:
            controllers = read_text(os.path.join(mount, "cgroup.controllers")).split()
        except OSError:
            controllers = []
        if "memory" not in controllers:  # hybrid mode: memory is on v1, our counters would be absent
            return Probe(False, f"memory controller not in the cgroup2 hierarchy at {mount} "
                                f"(systemd in hybrid mode)"), None
        unit = (configured_slice or "/" + SLICE_UNIT).strip("/")
        if not _valid_slice_unit(unit):
            return Probe(False, f"hosts.*.cgroup must name a slice unit (e.g. /hostrun.slice) "
                                f"for systemd, not {configured_slice}"), None
        manager, where = find_manager(euid, environ)
        if manager is None:
            return Probe(False, where), None
        if manager.user:
            root = mount.rstrip("/") + manager.root_cgroup
            try:
                delegated = read_text(os.path.join(root, "cgroup.controllers")).split()
            except OSError:
                return Probe(False, f"no cgroup {manager.root_cgroup} for the user manager"), None
            if "memory" not in delegated:
                service = os.path.basename(manager.root_cgroup)
                return Probe(False, f"the memory controller is not delegated to {service} "
                                    f"(it has: {' '.join(delegated) or 'none'}); an administrator "
                                    "can add it: 'systemctl edit user@.service', [Service] "
                                    "Delegate=pids memory cpu"), None
        from dispatch.core.pathsearch import which

        keeper = which("cat")
        if not keeper:
            return Probe(False, "no 'cat' on PATH (each job's scope is held by one)"), None
        return Probe(True, where), cls(mount, unit, manager, keeper)

    def describe(self) -> str:
        where = " in the user manager" if self.manager is not None and self.manager.user else ""
        return f"{self.slice_unit}{where} ({self.slice_dir})"

    def _require_manager(self) -> Manager:
        if self.manager is None:
            raise BackendError("no systemd manager to ask")
        return self.manager

    def ensure_slice(self, limit: int) -> None:
        """The slice's limits through systemd (runtime only), and the slice started, so its cgroup
        and counters exist before the first job."""
        self._ensure_unit(self.slice_unit, self.slice_dir, limit)

    def _ensure_unit(self, unit: str, directory: str, limit: int) -> None:
        """A slice unit limited to ``limit`` (swap 0) and started, unless it already is."""
        try:
            if self.limit_is(directory, limit):
                return  # already right: no round trip on every job
        except (OSError, ValueError):
            pass
        manager = self._require_manager()
        try:
            manager.set_properties(unit, [("MemoryMax", ("t", limit)), ("MemorySwapMax", ("t", 0))])
            if not os.path.isdir(directory):
                manager.start(unit)
        except BackendError as exc:
            raise BackendError(f"cannot set limits on {unit} through {manager.label}: {exc}") from None

    def take_problem(self, cgroup: str) -> str | None:
        """A user manager moves only processes inside its own subtree (``user@UID.service``): not a
        client started from a login shell (``session-N.scope``, root's)."""
        manager = self.manager
        if manager is None or not manager.user or cgroup.startswith(manager.root_cgroup + "/"):
            return None
        return (f"a systemd user manager can take only processes in its own subtree "
                f"({manager.root_cgroup}); this session runs in {cgroup}: start it with "
                "'hostrun session -- CMD', or inside the user manager ('systemd-run --user --scope')")

    def make_sessions(self) -> None:
        """The sessions slice is started by ``ensure_sessions``, through systemd."""

    def ensure_sessions(self, limit: int) -> None:
        """The sessions slice's limits through systemd (runtime only), and the slice started."""
        self._ensure_unit(self.sessions_unit, self.sessions_dir, limit)

    def create_session(self, job_id: str, cap: int, high: int) -> SystemdJob:
        """A session's scope in the sessions slice: capped, held back above ``high``
        (``MemoryHigh``), stopped whole on an OOM kill, as a job's scope is."""
        form = self.session_form
        assert form is not None
        unit = f"{form.prefix}{job_id}{form.suffix}"
        props = scope_properties(f"hostrun agent session {job_id}", self.sessions_unit, cap,
                                 self.kill_grace)
        props.append(("MemoryHigh", ("t", high)))
        return SystemdJob(os.path.join(self.sessions_dir, unit), cap, self.sessions_dir,
                          self._require_manager(), props, self.keeper_program, (self.slice_dir,))

    def create_job(self, job_id: str, cap: int) -> SystemdJob:
        prefix, suffix = self.job_affixes
        unit = f"{prefix}{job_id}{suffix}"
        props = scope_properties(f"hostrun job {job_id}", self.slice_unit, cap, self.kill_grace)
        return SystemdJob(os.path.join(self.slice_dir, unit), cap, self.slice_dir, self._require_manager(),
                          props, self.keeper_program)

    def job_at(self, path: str) -> SystemdJob | None:
        directory = self.job_dir(path)
        return None if directory is None else SystemdJob(directory, 0, self.slice_dir)
