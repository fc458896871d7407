"""``loads``: the standard library's JSON decoder without importing ``json``.

The agent hooks parse one JSON event before every shell command an agent runs, and most of the time
answer nothing. ``import json`` costs ~15 ms there (measured, bench/bench_hook.py): ``json.decoder``
imports ``re``, which imports ``enum``, for patterns the C scanner does not use. This module drives
the same C scanner (``_json.make_scanner``, what ``json.loads`` itself runs) directly, with the
settings ``json.loads`` uses by default, so the result is the same objects. Whatever it cannot read
is handed to ``json.loads``, so errors read exactly as json's own (a ``ValueError``).
"""

from __future__ import annotations

MYPY = False
if MYPY:
    from typing import Any

WHITESPACE = " \t\n\r"


def _constant(name: str) -> float:
    return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


class _Context:
    """The attributes ``_json.make_scanner`` reads from a ``json.JSONDecoder`` (its defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)


def loads(text: str) -> Any:
    """``json.loads(text)`` for a str."""
    make_scanner: Any = None
    try:
        from _json import make_scanner
    except ImportError:  # an interpreter without the C accelerator: json.loads alone
        pass
    if make_scanner is not None:
        start = len(text) - len(text.lstrip(WHITESPACE))
        try:
            value, end = make_scanner(_Context())(text, start)
        except (StopIteration, ValueError):
            pass  # json.loads below says what is wrong, as it always does
        else:
            if not text[end:].strip(WHITESPACE):
                return value
    import json

    return json.loads(text)
