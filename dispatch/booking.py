"""How a job is booked: kind, size and cgroup limit from its cap and its recorded peak.

- ``peak``: the label has a recorded peak, never hit its ceiling, and the peak is below the cap →
  booked at the peak; the cgroup limit stays the cap (or the slice). oom_score_adj 500.
- ``cap``: a cap is known (``--memory-cap``, else the host's ``default_cap``) → booked at the cap.
  oom_score_adj 0. A label that once hit its ceiling is booked this way from then on.
- ``gamble``: no history and no cap → booked at ``gamble_size``, limited only by the slice.
  oom_score_adj 1000, so the kernel kills it first.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dispatch.errors import NeverFitsError
from dispatch.fingerprint import short_hash
from dispatch.ledgerdb import PeakRecord
from dispatch.records import NamedTuple
from dispatch.text import storable
from dispatch.units import format_size

OOM_SCORE_ADJ = {"cap": 0, "peak": 500, "gamble": 1000}


class Plan(NamedTuple):
    kind: str
    size: int  # what the ledger books
    limit: int  # the job cgroup's memory limit
    oom_score_adj: int


def default_label(argv: Sequence[str]) -> str:
    """A stable fingerprint of the command: readable program name plus a hash of the whole argv
    (bytes that are not UTF-8 in the name are written ``\\xNN``: the label is stored as text)."""
    digest = short_hash("\0".join(argv).encode("utf-8", "surrogateescape"))
    return f"{storable(os.path.basename(argv[0])) or 'job'}-{digest}"


def plan_booking(
    *, cap: int | None, peak: PeakRecord | None, slice_limit: int, gamble_size: int
) -> Plan:
    if cap is not None and cap > slice_limit:
        raise NeverFitsError(
            f"cap {format_size(cap)} is larger than the whole slice ({format_size(slice_limit)}); "
            "it could never be admitted"
        )
    limit = cap if cap is not None else slice_limit
    if peak is not None and not peak.hit_ceiling and peak.max_peak > 0 and peak.max_peak < limit:
        kind, size = "peak", peak.max_peak
    elif cap is not None:
        kind, size = "cap", cap
    elif peak is not None and peak.hit_ceiling:
        kind, size = "cap", slice_limit
    else:
        kind, size = "gamble", min(gamble_size, slice_limit)
    return Plan(kind=kind, size=size, limit=limit, oom_score_adj=OOM_SCORE_ADJ[kind])
