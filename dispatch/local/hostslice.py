"""This host's slice: RAM → cap backend → slice limit, and the ledger's recovery hook over them.

Written once for every place that opens this host's slice or ledger (a run, a report, a
preflight ``min_free`` check, ``hostrun ledger``/``history``). Standard library only: a peer's
agent runs it there.
"""

from __future__ import annotations

from dispatch.capping import select_backend
from dispatch.core.hostfacts import read_meminfo

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence

    from dispatch.capping.base import CapBackend
    from dispatch.core.hostfacts import MemInfo
    from dispatch.core.settings import HostSettings, Settings
    from dispatch.local.store.ledgerdb import Booking


class LocalSlice:
    """``settings.local``, this machine's RAM and its cap backend (``select_backend`` may raise a
    BackendError). The limit is computed when first asked for, so a caller can refuse a host
    without a working backend before a bad ``reserve`` is reported."""

    __slots__ = ("_limit", "backend", "host", "mem", "source")

    def __init__(self, settings: Settings) -> None:
        self.host: HostSettings = settings.local
        self.source = settings.source  # the config file in use, named by the slice advice
        self.mem: MemInfo = read_meminfo()
        self.backend: CapBackend = select_backend(self.host, self.mem.total)
        self.backend.kill_grace = settings.kill_grace
        self._limit: int | None = None

    @property
    def limit(self) -> int:
        return self.limit_for(None)

    def limit_for(self, cap: int | None) -> int:
        """The slice's limit; where the default reserve leaves none, the 78 advises a slice that
        holds ``cap`` too."""
        if self._limit is None:
            fixed = self.backend.fixed_limit
            self._limit = fixed if fixed is not None else self.host.slice_limit(
                self.mem.total, self.source, cap)
        return self._limit

    def checked_cap(self, cap: int | None, no_cap: bool) -> int | None:
        """The job's cap (``-m``, else the host's ``default_cap``), once this host can run it at all:
        a backend that caps memory (or ``no_cap``) and a cap the slice could ever admit; else the
        refusal (78, 243) before anything is made or booked."""
        from dispatch.core.errors import NeverFitsError, NoCapBackendError

        if not self.backend.caps_memory and not no_cap:
            raise NoCapBackendError(
                "no memory-cap backend works on this host (run 'hostrun doctor' to see why); "
                "pass --no-cap to run uncapped anyway"
            )
        cap = cap if cap is not None else self.host.default_cap
        limit = self.limit_for(cap)  # 78 here when the default reserve leaves no slice
        if cap is not None and cap > limit:
            raise NeverFitsError(self.never_fits(cap))
        return cap

    @property
    def config(self) -> str:
        from dispatch.core.sliceadvice import config_file

        return config_file(self.source)

    def never_fits(self, cap: int) -> str:
        """The 243 line of a cap larger than the slice: where the slice's size came from, and the
        line to write (``dispatch.core.sliceadvice``), or why none would do."""
        from dispatch.core import sliceadvice as advice
        from dispatch.core.units import format_size

        host, mem = self.host, self.mem.total
        if self.backend.fixed_limit is not None:
            return advice.too_big(cap, self.limit, f"the {self.backend.name} slice's own limit",
                                  "ask for a smaller -m (that slice's size is its administrator's)")
        if host.slice_bytes is not None:
            how = f"hosts.{host.name}.slice in {self.config}"
        elif host.reserve_bytes is not None:
            how = (f"{format_size(mem)} of RAM less hosts.{host.name}.reserve "
                   f"{format_size(host.reserve_bytes)}")
        else:
            how = (f"{format_size(mem)} of RAM less the default reserve of "
                   f"{format_size(advice.default_reserve(mem))} for everything outside hostrun's jobs")
        key = "slice" if host.slice_bytes is not None else (
            "reserve" if host.reserve_bytes is not None else "")
        fix = advice.bigger(host.name, cap, mem, self.config, key)
        return advice.too_big(cap, self.limit, how, fix)

    def live_jobs(self) -> list[Booking]:
        """The running jobs to re-book, should a ledger read find its file damaged (the recovery
        code is imported only then)."""
        from dispatch.local.store.recovery import live_jobs

        return live_jobs(self.backend, self.host.name, self.limit)


def live_jobs_of(settings: Settings) -> Callable[[], list[Booking]]:
    """``live_jobs`` for a Ledger opened outside a run (``hostrun ledger``, ``history``): the
    backend is looked up only if a recovery needs it."""
    return lambda: LocalSlice(settings).live_jobs()


def outside_the_slice(settings: Settings, bookings: Sequence[Booking]) -> set[int]:
    """The ids of this host's rows whose cgroup is not one of its slice's job cgroups: nothing acts
    on them (a reclaim releases the row and leaves the cgroup alone), and ``hostrun ledger`` says so.
    With no working backend, or one that makes no slice, there is nothing to judge against."""
    mine = [b for b in bookings if b.cgroup and b.host == settings.local.name]
    if not mine:
        return set()
    from dispatch.core.errors import BackendError

    try:
        backend = LocalSlice(settings).backend
    except BackendError:  # a forced backend that does not work here
        return set()
    if not backend.caps_memory:
        return set()
    return {b.id for b in mine if b.cgroup and not backend.job_path_ok(b.cgroup)}
