"""``hostrun capacity --sessions``: sessions per host by the half rule in the sessions slice
(docs/capacity.md, "Sessions"), and ``hostrun capacity`` without it leaving ``session:`` labels to it.

The pure cases are computed by hand; the arithmetic is in the comments next to each expectation.
"""

from __future__ import annotations

from typing import Any

from dispatch.core.units import GiB, MiB
from dispatch.local.capacity import host_capacity


def entry(label: str, max_peak: int, *, runs: int = 1, last: int | None = None, hit: bool = False,
          history: list[int] | None = None, cap: int | None = None, cap_known: bool = True) -> dict[str, Any]:
    """A row of a report's ``peak_table`` (``dispatch.local.capacity.peak_table``), as it crosses SSH."""
    last = max_peak if last is None else last
    return {"label": label, "host": "local", "max_peak": max_peak, "runs": runs, "last_peak": last,
            "hit_ceiling": hit, "history": [last] if history is None else history,
            "cap_known": cap_known, "last_cap": cap, "slice_full_marked": False}


def report(table: list[dict[str, Any]], *, slice_limit: int = 60 * GiB, share: float | None = 0.5,
           cap: int = 4608 * MiB, running: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A machine's report read with ``peaks=True``; ``share`` None: an older peer's, without the
    sessions figures."""
    settings: dict[str, Any] = {"default_cap": None, "gamble_size": 512 * MiB}
    if share is not None:
        limit = int(slice_limit * share) // 4096 * 4096
        settings["sessions"] = {"limit": limit, "share": share, "cap": cap, "first_booking": 2 * GiB,
                                "high": 0.9}
    return {"host": "local", "hostname": "box", "slice": {"limit": slice_limit}, "settings": settings,
            "running": running or [], "peak_table": table}


# -- hostrun capacity without --sessions --

def test_the_jobs_view_leaves_session_labels_to_sessions() -> None:
    table = [entry("build", 3 * GiB), entry("session:claude", 1970 * MiB), entry("session:codex", GiB)]
    h = host_capacity("local", report(table))
    assert [a.label for a in h.labels] == ["build"]  # judged against the jobs' rules
    assert h.session_labels == 2 and h.as_dict()["session_labels"] == 2
    only = host_capacity("local", report([entry("session:claude", GiB)]))
    assert (only.labels, only.session_labels) == ([], 1)
    assert host_capacity("local", report([entry("build", GiB)])).session_labels == 0
