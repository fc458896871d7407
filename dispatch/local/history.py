"""The run history (``hostrun history``): what each finished run peaked at, how long it took and how
it ended, from the ``runs`` table of the ledger (standard library only).

A local run writes its own row, in the transaction that records its peak (``dispatch.local.run.runner``). A
run on a peer is written twice: by the peer's agent in the peer's ledger (the same runner), and here by
the controller in its own ledger, with the peer's name as the host (``record_peer_run``). Runs that
never started are not in it: hostrun's own refusals (usage, never-fits, an unmet preflight, a peer
that cannot be reached, ...) and jobs interrupted while waiting for room.
"""

from __future__ import annotations

import time

from dispatch.core.units import parse_duration

MYPY = False
if MYPY:
    from collections.abc import Callable
    from typing import Any

    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import Settings
    from dispatch.local.store.ledgerdb import RunRecord


def since_time(text: str, now: float | None = None) -> float:
    """``--since``: a duration ago ("2h", "7d", "90m") or an ISO date/time in local time unless it
    names its offset ("2024-05-01", "2024-05-01T14:30", "2024-05-01T14:30:00+02:00"); ValueError
    otherwise."""
    try:
        return (time.time() if now is None else now) - parse_duration(text)
    except ValueError:
        pass
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(f"not a duration ago (e.g. 2h, 7d) or an ISO date/time (e.g. 2024-05-01, "
                         f"2024-05-01T14:30): {text!r}") from None


def as_dict(run: RunRecord) -> dict[str, Any]:
    """One row for ``--json``; field names as in ``--result-file`` where both have them."""
    return {
        "id": run.id, "started": run.started, "ended": run.ended, "duration_s": run.duration,
        "waited_s": run.waited, "host": run.host, "label": run.label, "session": run.session,
        "command": run.command, "cap_bytes": run.cap, "booking_kind": run.kind,
        "booked_bytes": run.booked, "peak_bytes": run.peak, "exit_code": run.exit_code,
        "outcome": run.outcome, "hit_ceiling": run.hit_ceiling,
    }


def record_peer_run(settings: Settings, outcome: Outcome, request: RunRequest,
                    say: Callable[[str], None]) -> None:
    """The controller's row for a run on a peer (``outcome.host`` is the peer's name). The job has
    run: a failure here must not change its exit status, so it is one warning."""
    from dispatch.core.errors import HostrunError
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.hostslice import live_jobs_of
    from dispatch.local.store.ledgerdb import run_row

    try:
        ledger = Ledger(settings.state_dir, say, live_jobs_of(settings))
        try:
            ledger.record_run(run_row(outcome, request.session, request.argv),
                              settings.history_keep)
        finally:
            ledger.close()
    except HostrunError as exc:  # the ledger failed, or the state dir is not one to trust
        say(f"warning: the history row of this run was not recorded here: {exc}")
