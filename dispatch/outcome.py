"""The outcome of one run, as the exit code says it and as ``--result-file`` writes it (JSON)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    exit_code: int
    outcome: str  # "exit", "signal", or an outcome name from dispatch.exitcodes
    host: str
    label: str
    argv: list[str]
    cap_bytes: int | None = None
    booking_kind: str | None = None
    booked_bytes: int | None = None
    peak_bytes: int | None = None
    duration_s: float = 0.0
    waited_s: float = 0.0
    backend: str | None = None
    cgroup: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def write_result(path: str, outcome: Outcome) -> None:
    """Write atomically, so a reader polling for the file never sees half of it."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(outcome.to_dict(), fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
