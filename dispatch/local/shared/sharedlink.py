"""A run's connection to a shared slice's admission engine (``dispatch.local.shared.sharedd``).

The same conversation as with a user's own engine (``admitclient.Link``: plan, wait, attach,
release with the run's record), with three differences: the engine is root's and systemd's (reached at the
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
from dispatch.local.engine.admitclient import REACH_TRIES, Link
from dispatch.local.engine.reach import try_connect

MYPY = False
if MYPY:
    from collections.abc import Callable

    from dispatch.core.engineshape import Request
    from dispatch.core.settings import Settings
    from dispatch.local.hostslice import LocalSlice


class SharedLink(Link):
    """One connection to the shared slice's engine at ``path``."""

    def __init__(self, settings: Settings, say: Callable[[str], None], path: str) -> None:
        super().__init__(settings, say)
        self.path = path

    def address(self) -> str:
        return self.path

    def connect(self) -> Link:
        """Reach the engine (systemd queues the connection while it starts one); 78 when there is
        none. Its ``hello`` goes with the first request (``Link.send``: another version's engine is
        refused there, 78)."""
        last: Exception | None = None
        for attempt in range(REACH_TRIES):
            self.close()
            try:
                sock = try_connect(self.path)
            except EngineError as exc:
                raise SharedError(f"cannot reach the shared slice's engine: {exc}") from None
            if sock is not None:
                self.sock, self.buf, self.greeting = sock, b"", True
                return self
            last = ConnectionRefusedError(f"nothing listens at {self.path}")
            time.sleep(0.1 * (attempt + 1))
        raise SharedError(f"cannot reach the shared slice's engine at {self.path} ({last}); "
                          "nothing ran")

    def release(self) -> None:
        """Give the booking back with the run's record (one request); through the next engine when
        this one went (the booking attached to it first). Never through a ledger of the user's: when
        no engine can be reached, the next one releases the booking once this run has ended, and the
        record is one warning."""
        booking_id, record = self.booking_id, self.record
        self.record = None
        if booking_id is None:
            return
        message: Request = {"op": "release", "id": booking_id}
        if record is not None:
            message["record"] = record[0]
        done = False
        try:
            if self.sock is None:
                raise ConnectionError("not connected")
            self.ask(message)
            done = True
        except (ConnectionError, OSError):
            done = self._again(message)
        except HostrunError as exc:  # refused: the booking goes with the connection, as it ends
            self.say(f"warning: the shared slice's engine refused this run's release: {exc}")
            done = True
        if not done and record is not None:
            self.say("warning: the shared slice's engine went away: this run's peak and history row "
                     "were not recorded")
        self.booking_id = None

    def _again(self, message: Request) -> bool:
        """``message`` asked of the next engine, this booking attached to it first: whether it was."""
        try:
            self._reattach()
            self.ask(message)
            return True
        except (ConnectionError, OSError, HostrunError):
            return False


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
    return here if here.backend.engine_socket is not None else None


def engine_link(settings: Settings, say: Callable[[str], None], here: LocalSlice | None) -> Link:
    """The connection a run books on: the engine of ``here``'s backend when it has its own
    (``CapBackend.engine_socket``: a shared slice's), else its own state dir's engine's."""
    socket = here.backend.engine_socket if here is not None else None
    return Link(settings, say) if socket is None else SharedLink(settings, say, socket)

