"""Pick the memory-cap backend: the first of shared, systemd, cgroup2, cgroup1 whose probe succeeds,
else none.

A host's ``backend`` key forces one (its probe must still succeed). ``probe_all`` feeds ``hostrun
doctor``, which shows why each backend is or is not usable.
"""

from __future__ import annotations

from dispatch.capping.base import CapBackend, Probe
from dispatch.core.errors import BackendError
from dispatch.core.settings import HostSettings

ORDER = ("shared", "systemd", "cgroup2", "cgroup1")


def _self_files() -> tuple[str, str] | None:
    """/proc/self/cgroup and mountinfo, read once for all the probes (None: each probe reports why
    it cannot read them)."""
    from dispatch.capping.cgroupfs import read_self_files

    try:
        return read_self_files()
    except OSError:
        return None


def _probe(name: str, host: HostSettings,
           files: tuple[str, str] | None = None) -> tuple[Probe, CapBackend | None]:
    if host.cgroup is not None:  # checked at load too; this catches values that skipped the load
        from dispatch.core.settings import cgroup_path_problem  # (a controller's fallback on a peer)

        problem = cgroup_path_problem(host.cgroup)
        if problem is not None:
            return Probe(False, f"hosts.{host.name}.cgroup: {problem}"), None
    if name == "shared":
        from dispatch.capping.shared import SharedBackend

        return SharedBackend.probe(files)
    if name == "systemd":
        from dispatch.capping.systemd import SystemdBackend

        return SystemdBackend.probe(host.cgroup, files=files)
    if name == "cgroup2":
        from dispatch.capping.cgroup2 import Cgroup2Backend

        return Cgroup2Backend.probe(host.cgroup, files)
    from dispatch.capping.cgroup1 import Cgroup1Backend

    return Cgroup1Backend.probe(host.cgroup, files)


def probe_all(host: HostSettings) -> list[tuple[str, Probe]]:
    files = _self_files()
    return [(name, _probe(name, host, files)[0]) for name in ORDER]


def select_backend(host: HostSettings, mem_total: int) -> CapBackend:
    """The backend to use; ``none`` (a NoCapBackend) when nothing works here."""
    from dispatch.capping.nocap import NoCapBackend

    if host.backend == "none":
        return NoCapBackend(mem_total)
    names = (host.backend,) if host.backend else ORDER
    reasons = []
    files = _self_files()
    for name in names:
        probe, backend = _probe(name, host, files)
        if backend is not None:
            return backend
        reasons.append(f"{name}: {probe.detail}")
    if host.backend:
        raise BackendError(f"hosts.{host.name}.backend = {host.backend!r} is not usable here: "
                           f"{reasons[0]}")
    return NoCapBackend(mem_total)
