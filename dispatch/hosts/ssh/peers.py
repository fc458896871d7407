"""Choosing a peer for ``--peer``: the first two of the peer driver's seven steps."""

from __future__ import annotations

from dispatch.core.errors import UsageError
from dispatch.core.settings import Settings
from dispatch.hosts.base import Host
from dispatch.hosts.kinds import hosts_of


def choose_peer(settings: Settings, wanted: str | bool, cap: int | None, by_host: bool = False) -> Host:
    """The peer named by ``--peer=NAME`` (or the first configured one for plain ``--peer``; with
    ``by_host``, named by ``--host NAME``): a host that is not this machine; its kind then checks the
    cap (``Host.check_cap``: 249)."""
    peers = [h for h in hosts_of(settings) if not h.is_here]
    if not peers:
        raise UsageError("--peer: no peer is configured (add a [hosts.NAME] table with ssh = ...)")
    if isinstance(wanted, str):
        chosen = next((h for h in peers if h.name == wanted), None)
        if chosen is None:
            said = f"--host {wanted}: no such host" if by_host else f"--peer={wanted}: no such peer"
            names = list(settings.hosts) if by_host else [h.name for h in peers]
            raise UsageError(f"{said} (configured: {', '.join(names)})")
    else:
        chosen = peers[0]
    chosen.check_cap(cap)
    return chosen


def effective_cap(host: Host, cap: int | None) -> int | None:
    """The cap a job runs under on ``host`` as far as the controller knows before contacting it
    (``Host.job_cap`` with this controller's ``default_cap`` for it)."""
    return host.job_cap(cap, host.table.default_cap)
