"""A run's connection to a shared slice's admission engine (``dispatch.local.sharedd``).

The same conversation as with a user's own engine (``admitclient.Link``: plan, wait, attach,
record, release), with three differences: the engine is root's and systemd's (reached at the
shared socket, never started by a run: systemd starts it on the first connection and restarts it);
the job's cgroup is the scope that engine starts (``capping.shared.SharedJob.adopt``); and when the
engine has gone at a run's end, its record and release go through the next one, never through a
ledger of the user's (the slice's ledger is root's). A release that cannot reach any engine is
not lost: the next engine releases a booking whose holder has ended. Which engine a run books on
(``engine_link``) is decided here too. Standard library only.
"""

from __future__ import annotations

import os
import time

from dispatch.core.errors import EngineError, HostrunError, SharedError
from dispatch.local.admitclient import REACH_TRIES, Link, _try_connect

MYPY = False
if MYPY:
    from collections.abc import Callable
    from typing import Any

    from dispatch.core.settings import Settings
    from dispatch.local.hostslice import LocalSlice
    from dispatch.local.ledger import Ledger


class SharedLink(Link):
    """One connection to the shared slice's engine at ``path``."""

    def __init__(self, settings: Settings, say: Callable[[str], None], path: str) -> None:
        super().__init__(settings, say)
        self.path = path

    def connect(self) -> Link:
        """Reach the engine (systemd queues the connection while it starts one); 78 when there is
        none, or one of another version."""
        from dispatch.capping.shared import PROTOCOL  # not on a plain run's path: a shared one's

        last: Exception | None = None
        for attempt in range(REACH_TRIES):
            self.close()
            try:
                sock = _try_connect(self.path)
            except EngineError as exc:
                raise SharedError(f"cannot reach the shared slice's engine: {exc}") from None
            if sock is None:
                last = ConnectionRefusedError(f"nothing listens at {self.path}")
            else:
                self.sock, self.buf = sock, b""
                try:
                    hello = self.ask({"op": "hello", "protocol": PROTOCOL})
                except (ConnectionError, BrokenPipeError) as exc:
                    last = exc
                else:
                    if hello.get("protocol") != PROTOCOL:
                        raise SharedError(f"the shared slice's engine speaks protocol "
                                          f"{hello.get('protocol')!r}, this hostrun {PROTOCOL}: "
                                          "install the same version")
                    return self
            time.sleep(0.1 * (attempt + 1))
        raise SharedError(f"cannot reach the shared slice's engine at {self.path} ({last}); "
                          "nothing ran")

    def _again(self, message: dict[str, Any]) -> bool:
        """``message`` asked of the next engine, this booking attached to it first: whether it was."""
        try:
            self._reattach()
            self.ask(message)
            return True
        except (ConnectionError, OSError, HostrunError):
            return False

    def _record(self, fields: dict[str, Any], direct: Callable[[Ledger], None]) -> None:
        if self.booking_id is None:
            return
        message = {"op": "record", "id": self.booking_id, **fields}
        try:
            if self.sock is None:
                raise ConnectionError("not connected")
            self.ask(message)
        except (ConnectionError, OSError):
            if not self._again(message):
                self.say("warning: the shared slice's engine went away: this run's peak and history "
                         "row were not recorded")

    def release(self) -> None:
        booking_id = self.booking_id
        if booking_id is None:
            return
        message = {"op": "release", "id": booking_id}
        try:
            if self.sock is None:
                raise ConnectionError("not connected")
            self.ask(message)
        except (ConnectionError, OSError):
            self._again(message)  # else the next engine releases it once this run has ended
        self.booking_id = None


def shared_here(settings: Settings) -> LocalSlice | None:
    """This host's slice when it is a shared one (``dispatch.capping.shared``), whose engine books
    every run, decided as the cap backend is chosen (``select_backend``: a member whose shared slice
    does not answer is refused there, 78). Only where a shared slice is installed is anything more
    than two ``stat`` calls done."""
    if settings.local.backend not in (None, "shared"):
        return None
    from dispatch.capping.cgroupfs import socket_path
    from dispatch.capping.sharedmember import UNIT_PATH

    if not (os.path.exists(socket_path()) or os.path.exists(UNIT_PATH)):
        return None
    from dispatch.local.hostslice import LocalSlice

    here = LocalSlice(settings)
    return here if here.backend.name == "shared" else None


def engine_link(settings: Settings, say: Callable[[str], None], here: LocalSlice | None) -> Link:
    """The connection a run books on: the shared slice's engine's (``here``), else its own
    state dir's engine's."""
    if here is None:
        return Link(settings, say)
    from dispatch.capping.shared import SharedBackend

    backend = here.backend
    assert isinstance(backend, SharedBackend)
    return SharedLink(settings, say, backend.socket_path)

