"""Pick the memory-cap backend: the first in ``BACKENDS`` whose probe succeeds, else none. A backend
that /proc/self/mountinfo shows cannot work here is not probed, nor imported (``candidates``).

``BACKENDS`` is the one registry of backends, for both paths: the controller's configuration check
(``dispatch.config.model``) and every run, here or in a peer's agent, which reads the peer's own file
without that check (an unknown name is refused here, never taken for another backend). A new
backend is one entry: its module and class, whose ``probe`` has the one signature of
``CapBackend.probe``. A host's ``backend`` key forces one (its probe must still succeed).
``probe_all`` feeds ``hostrun doctor``, which shows why each backend is or is not usable.
"""

from __future__ import annotations

import os
import sys

from dispatch.capping.base import CapBackend, Probe
from dispatch.core.errors import BackendError
from dispatch.core.faces import lazy_attributes
from dispatch.core.settings import HostSettings

# Each backend's module and class, in the order they are probed; ``none`` is never probed: it is
# what is left when no other works, or what a host's ``backend`` forces.
BACKENDS: dict[str, str] = {
    "shared": "dispatch.capping.shared:SharedBackend",
    "systemd": "dispatch.capping.systemd:SystemdBackend",
    "cgroup2": "dispatch.capping.cgroup2:Cgroup2Backend",
    "cgroup1": "dispatch.capping.cgroup1:Cgroup1Backend",
    "none": "dispatch.capping.nocap:NoCapBackend",
}
NONE = "none"
ORDER = tuple(name for name in BACKENDS if name != NONE)


def backend_class(name: str, host: str = "") -> type[CapBackend]:
    """The class registered as ``name`` (``__import__``: the ``importlib`` package would load
    ``warnings`` on every run's path); BackendError naming the known ones when there is none."""
    if name not in BACKENDS:
        where = f"hosts.{host}.backend" if host else "backend"
        raise BackendError(f"{where} = {name!r} is not a cap backend (known: {', '.join(BACKENDS)})")
    module, _, cls = BACKENDS[name].partition(":")
    __import__(module)
    found: type[CapBackend] = getattr(sys.modules[module], cls)
    return found


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
    return backend_class(name, host.name).probe(host.cgroup, files)


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

    if host.backend is not None:
        backend_class(host.backend, host.name)  # an unknown name ends here, before anything is said
    if host.backend not in (None, "shared"):
        _note_outside(host.backend)
    if host.backend == NONE:
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

# What the command line may use of this part (dispatch.core.faces), each loaded when first asked for.
SURFACE: dict[str, str] = {
    "listing": "dispatch.capping.shared",
    "listing_lines": "dispatch.capping.shared",
}
__all__ = ["listing", "listing_lines"]
MYPY = False
if MYPY:
    from dispatch.capping.shared import listing as listing
    from dispatch.capping.shared import listing_lines as listing_lines

__getattr__ = lazy_attributes(__name__, SURFACE)
