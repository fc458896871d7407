"""Pick the memory-cap backend: the first of systemd, cgroup2, cgroup1 whose probe succeeds, else none.

A host's ``backend`` key forces one (its probe must still succeed). ``probe_all`` feeds ``hostrun
doctor``, which shows why each backend is or is not usable.
"""

from __future__ import annotations

from dispatch.capping.base import CapBackend, Probe
from dispatch.core.errors import BackendError
from dispatch.core.settings import HostSettings

ORDER = ("systemd", "cgroup2", "cgroup1")


def _probe(name: str, host: HostSettings) -> tuple[Probe, CapBackend | None]:
    if host.cgroup is not None:  # checked at load too; this catches values that skipped the load
        from dispatch.core.settings import cgroup_path_problem  # (a controller's fallback on a peer)

        problem = cgroup_path_problem(host.cgroup)
        if problem is not None:
            return Probe(False, f"hosts.{host.name}.cgroup: {problem}"), None
    if name == "systemd":
        from dispatch.capping.systemd import SystemdBackend

        return SystemdBackend.probe(host.cgroup)
    if name == "cgroup2":
        from dispatch.capping.cgroup2 import Cgroup2Backend

        return Cgroup2Backend.probe(host.cgroup)
    from dispatch.capping.cgroup1 import Cgroup1Backend

    return Cgroup1Backend.probe(host.cgroup)


def probe_all(host: HostSettings) -> list[tuple[str, Probe]]:
    return [(name, _probe(name, host)[0]) for name in ORDER]


def select_backend(host: HostSettings, mem_total: int) -> CapBackend:
    """The backend to use; ``none`` (a NoCapBackend) when nothing works here."""
    from dispatch.capping.nocap import NoCapBackend

    if host.backend == "none":
        return NoCapBackend(mem_total)
    names = (host.backend,) if host.backend else ORDER
    reasons = []
    for name in names:
        probe, backend = _probe(name, host)
        if backend is not None:
            return backend
        reasons.append(f"{name}: {probe.detail}")
    if host.backend:
        raise BackendError(f"hosts.{host.name}.backend = {host.backend!r} is not usable here: "
                           f"{reasons[0]}")
    return NoCapBackend(mem_total)
