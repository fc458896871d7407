"""Pick the memory-cap backend: the first of shared, systemd, cgroup2, cgroup1 whose probe succeeds,
else none. A backend that /proc/self/mountinfo shows cannot work here is not probed, nor imported
(``candidates``).

A host's ``backend`` key forces one (its probe must still succeed). ``probe_all`` feeds ``hostrun
doctor``, which shows why each backend is or is not usable.
"""

from __future__ import annotations

import os

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


def candidates(files: tuple[str, str] | None) -> tuple[str, ...]:
    """ORDER, less the backends whose probe ``files`` already show would fail, so that their modules
    (the shared daemon's client, systemd's D-Bus, cgroup2: ~3 ms) are not imported on every run of
    a cgroup v1 host. Each rule is a check the probe itself makes first: systemd and cgroup2 need the
    memory controller in a cgroup2 hierarchy, which the kernel never gives while a v1 hierarchy holds
    it (a v1 ``memory`` mount); shared needs its socket and a cgroup2 mount. ``files`` None
    (unreadable): every backend, and each probe says why it failed."""
    if files is None:
        return ORDER
    from dispatch.capping import sharedmember
    from dispatch.capping.cgroupfs import parse_mountinfo, socket_path

    mounts = parse_mountinfo(files[1])
    v2_memory = "cgroup2" in mounts and "memory" not in mounts
    possible = {"shared": "cgroup2" in mounts and (os.path.exists(socket_path())
                                                   or os.path.exists(sharedmember.UNIT_PATH)),
                "systemd": v2_memory, "cgroup2": v2_memory}
    return tuple(name for name in ORDER if possible.get(name, True))


def probe_all(host: HostSettings) -> list[tuple[str, Probe]]:
    files = _self_files()
    return [(name, _probe(name, host, files)[0]) for name in ORDER]


def select_backend(host: HostSettings, mem_total: int) -> CapBackend:
    """The backend to use; ``none`` (a NoCapBackend) when nothing works here.

    A member of an installed shared slice never falls past it to a slice of their own: when the
    shared probe fails the run ends 78 (SharedError), unless the configuration forced another
    backend, which is then said on stderr (``sharedmember``)."""
    from dispatch.capping.nocap import NoCapBackend

    if host.backend not in (None, "shared"):
        _note_outside(host.backend)
    if host.backend == "none":
        return NoCapBackend(mem_total)
    reasons = []
    files = _self_files()
    names = (host.backend,) if host.backend else candidates(files)
    for name in names:
        probe, backend = _probe(name, host, files)
        if backend is not None:
            return backend
        if name == "shared" and not host.backend:
            _refuse_if_member(probe.detail)
        reasons.append(f"{name}: {probe.detail}")
    if host.backend:
        raise BackendError(f"hosts.{host.name}.backend = {host.backend!r} is not usable here: "
                           f"{reasons[0]}")
    return NoCapBackend(mem_total)


def _refuse_if_member(why: str) -> None:
    """Raise SharedError when this user belongs to an installed shared slice (its probe failed)."""
    from dispatch.capping.sharedmember import member_group, refusal
    from dispatch.core.errors import SharedError

    group = member_group()
    if group is not None:
        raise SharedError(refusal(group, why))


def _note_outside(backend: str) -> None:
    """Say on stderr that a member's configuration runs this job outside the shared budget."""
    import sys

    from dispatch.capping.sharedmember import member_group, outside_note

    group = member_group()
    if group is not None:
        print(outside_note(group, backend), file=sys.stderr)
