"""Parse and print sizes (``512M``, ``8G``, ``1.5GiB``) and durations (``30s``, ``2h``).

Binary units throughout: ``G``, ``GB`` and ``GiB`` all mean 2**30, because every size hostrun handles
is compared with kernel figures, which are binary.
"""

from __future__ import annotations

MiB = 1 << 20
GiB = 1 << 30
MIN_SIZE = MiB  # below 1 MiB no cap, slice, reserve's remainder or booking can hold a process at all

_SIZE_UNITS = {prefix + suffix: mult for prefix, mult in
               (("", 1), ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40), ("p", 1 << 50))
               for suffix in ("", "b", "ib")}
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _number_and_unit(text: str) -> tuple[str, str] | None:
    """``' 1.5 GiB '`` -> ``('1.5', 'gib')``: digits, an optional fraction, optional spaces, the rest
    lower-cased. By hand, not with ``re``: ``-m 8G`` is on the path of nearly every ``hostrun``
    call, and importing ``re`` costs it ~2.5 ms."""
    s = text.strip()
    i = 0
    while i < len(s) and s[i].isdecimal():
        i += 1
    if i == 0:
        return None
    if i < len(s) and s[i] == ".":
        j = i + 1
        while j < len(s) and s[j].isdecimal():
            j += 1
        if j == i + 1:
            return None
        i = j
    return s[:i], s[i:].lstrip().lower()


def parse_size(text: str | int) -> int:
    """Bytes from ``'512M'``, ``'8G'``, ``'1.5GiB'``, ``'1024'`` or an int; ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    parsed = _number_and_unit(str(text))
    if parsed is None or parsed[1] not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 8G, 1.5GiB)")
    return int(float(parsed[0]) * _SIZE_UNITS[parsed[1]])


def parse_duration(text: str | int | float) -> float:
    """Seconds from ``'30s'``, ``'2h'``, ``'1.5m'``, ``'250ms'`` or a number; ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text}")
        return float(text)
    parsed = _number_and_unit(str(text))
    if parsed is None or parsed[1] not in _DUR_UNITS:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h)")
    return float(parsed[0]) * _DUR_UNITS[parsed[1]]


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
