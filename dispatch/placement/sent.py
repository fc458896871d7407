"""Where a ``--peer``/``--host`` run goes, and the note that it was sent (``dispatch.placement.pending``).

Apart from ``dispatch.placement.auto`` (the dispatcher's ``--auto``): a run sent to a named host
reads no report and needs none of the dispatcher, so it does not import it.
"""

from __future__ import annotations

from dispatch.core.errors import AcrossDisabledError
from dispatch.core.records import NamedTuple
from dispatch.core.settings import Settings
from dispatch.hosts.ssh.peers import choose_peer
from dispatch.placement.pending import Pending

MYPY = False
if MYPY:
    from typing import Optional

    from dispatch.hosts.base import Host


class Placement(NamedTuple):
    """Where a ``--auto``/``--peer`` run goes, already noted as pending (``forget_sent(note)`` after).

    ``host`` runs the job (``Host.run``); ``refused`` is the exit code when it runs nowhere (``host``
    None then); ``reasons`` are the dispatcher's, for the caller to show.
    """

    host: Optional[Host] = None
    refused: int | None = None
    note: int | None = None
    reasons: tuple[str, ...] = ()


def place_on_peer(settings: Settings, wanted: str | bool, label: str, cap: int | None,
                  gpu_memory: int | None, by_host: bool = False) -> Placement:
    """``--peer[=NAME]``: never a silent local run when peers are off (248); the cap is checked
    against the peer's ``peer_memory_cap`` (249); the room it will take is noted as pending."""
    if not settings.enable_across_machines:
        flag = f"--host {wanted}" if by_host else "--peer"
        raise AcrossDisabledError(f"{flag}: enable_across_machines is off (set it in the config "
                                  "or ENABLE_ACROSS_MACHINES=1); not running locally instead")
    host = choose_peer(settings, wanted, cap, by_host)
    note = note_sent(settings, host.name, label, host.pending_estimate(cap), gpu_memory)
    return Placement(host=host, note=note)


def note_sent(settings: Settings, host: str, label: str, need: int, gpu_bytes: int | None = None,
              gpu_index: int | None = None) -> int:
    """Record a pending booking for a job sent to ``host``; returns the note's id (``forget_sent``)."""
    pending = Pending(settings.state_dir)
    try:
        return pending.add(host, label, need, gpu_bytes, gpu_index)
    finally:
        pending.close()


def forget_sent(settings: Settings, note: int | None) -> None:
    """The run ended: its booking is released (or was never made), so its note is done."""
    if note is None:
        return
    pending = Pending(settings.state_dir)
    try:
        pending.remove(note)
    finally:
        pending.close()
