"""A run's connection to a shared slice's admission engine (``dispatch.local.sharedd``).

The same conversation as with a user's own engine (``admitclient.Link``: plan, wait, attach,
record, release), with three differences: the engine is root's and systemd's (reached at the
shared socket, never started by a run: systemd starts it on the first connection and restarts it);
the job's cgroup is the scope that engine starts (``capping.shared.SharedJob.adopt``); and when the
engine has gone at a run's end, its record and release go through the next one, never through a
ledger of the user's (the slice's ledger is root's). A release that cannot reach any engine is
not lost: the next engine releases a booking whose holder has ended. Standard library only.
"""

from __future__ import annotations

import time

from dispatch.capping.shared import PROTOCOL
from dispatch.core.errors import EngineError, HostrunError, SharedError
from dispatch.local.admitclient import REACH_TRIES, Link, _try_connect

MYPY = False
if MYPY:
    from collections.abc import Callable
    from typing import Any

    from dispatch.core.settings import Settings
    from dispatch.local.ledger import Ledger


class SharedLink(Link):
    """One connection to the shared slice's engine at ``path``."""

    def __init__(self, settings: Settings, say: Callable[[str], None], path: str) -> None:
        super().__init__(settings, say)
        self.path = path

    def connect(self) -> Link:
        """Reach the engine (systemd queues the connection while it starts one); 78 when there is
        none, or one of another version."""
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
