"""Choosing a peer for ``--peer``: the first two of the peer driver's seven steps."""

from __future__ import annotations

from dispatch.core.errors import OverPeerCapError, UsageError
from dispatch.core.settings import HostSettings, Settings
from dispatch.core.units import format_size
from dispatch.local.booking import peer_cap


def choose_peer(settings: Settings, wanted: str | bool, cap: int | None) -> HostSettings:
    """The peer named by ``--peer=NAME`` (or the first configured one for plain ``--peer``), after
    checking the cap against its ``peer_memory_cap`` (249)."""
    peers = [h for h in settings.hosts.values() if not h.is_local]
    if not peers:
        raise UsageError("--peer: no peer is configured (add a [hosts.NAME] table with ssh = ...)")
    if isinstance(wanted, str):
        chosen = next((h for h in peers if h.name == wanted), None)
        if chosen is None:
            raise UsageError(f"--peer={wanted}: no such peer (configured: "
                             f"{', '.join(h.name for h in peers)})")
    else:
        chosen = peers[0]
    effective = effective_cap(chosen, cap)
    if chosen.peer_memory_cap is not None and effective is not None and effective > chosen.peer_memory_cap:
        raise OverPeerCapError(f"--peer={chosen.name}: cap {format_size(effective)} exceeds its "
                               f"peer_memory_cap ({format_size(chosen.peer_memory_cap)})")
    return chosen


def effective_cap(host: HostSettings, cap: int | None) -> int | None:
    """The cap a job runs under on ``host`` as far as the controller knows before contacting it
    (``booking.peer_cap`` with this controller's ``default_cap`` for it)."""
    return peer_cap(cap, host.default_cap, host.peer_memory_cap)
