"""Parse and print sizes (``512M``, ``8G``, ``1.5GiB``) and durations (``30s``, ``2h``).

Binary units throughout: ``G``, ``GB`` and ``GiB`` all mean 2**30, because every size hostrun handles
is compared with kernel figures, which are binary.
"""

from __future__ import annotations

import functools

MYPY = False
if MYPY:
    import re

_SIZE_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$"
_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_DUR_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$"
_DUR_MULT = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


@functools.cache
def _pattern(source: str) -> re.Pattern[str]:
    """Compiled on first use: ``re`` stays off the import path of ``hostrun -- CMD``."""
    import re

    return re.compile(source, re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from ``'512M'``, ``'8G'``, ``'1.5GiB'``, ``'1024'`` or an int; ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    m = _pattern(_SIZE_PATTERN).match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 8G, 1.5GiB)")
    return int(float(m.group(1)) * _SIZE_MULT[m.group(2).lower()])


def parse_duration(text: str | int | float) -> float:
    """Seconds from ``'30s'``, ``'2h'``, ``'1.5m'``, ``'250ms'`` or a number; ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text}")
        return float(text)
    m = _pattern(_DUR_PATTERN).match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h)")
    return float(m.group(1)) * _DUR_MULT[(m.group(2) or "").lower()]


def format_size(n: int | float | None) -> str:
    """``'5.0 GiB'``, ``'512 MiB'``: one decimal from GiB up, as the status lines print sizes."""
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, mult in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult:
            value = n / mult
            return f"{sign}{value:.1f} {unit}" if unit in ("TiB", "GiB") else f"{sign}{value:.0f} {unit}"
    return f"{sign}{n:.0f} B"


def format_duration(seconds: float | None) -> str:
    """``'12 min'``, ``'3 s'``, ``'2.1 h'``: the precision a person reads in a status line."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
