"""``loads`` and ``dumps``: the standard library's JSON decoder and encoder without importing ``json``.

The agent hooks parse one JSON event before every shell command an agent runs, and most of the time
answer nothing. ``import json`` costs ~15 ms there (measured, bench/bench_hook.py): ``json.decoder``
imports ``re``, which imports ``enum``, for patterns the C scanner does not use. This module drives
the same C scanner (``_json.make_scanner``, what ``json.loads`` itself runs) directly, with the
settings ``json.loads`` uses by default, so the result is the same objects. Whatever it cannot read
is handed to ``json.loads``, so errors read exactly as json's own (a ``ValueError``).

``dumps`` writes what ``json.dumps(obj, indent=2, sort_keys=True)`` writes, for the plain values a
result file holds (dict with str keys, list, tuple, str, int, float, bool, None), with json's own C
string escaper (``_json.encode_basestring_ascii``): ``hostrun --result-file`` writes one after every
run, and ``import json`` (with ``re`` and ``base64``) was ~8 ms of such a run's CPU. Anything else
(another key or value type, a cycle) is handed to ``json.dumps``.
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


class _Unplain(Exception):
    """A value ``dumps`` leaves to ``json.dumps``."""


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _encode(value: Any, quote: Any, indent: str, depth: int) -> str:
    """One value, tested in the order json's own encoder tests (subclasses included)."""
    if isinstance(value, str):
        return str(quote(value))
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float(value)
    if depth > 64:  # deeper than any result: a cycle, as likely as not
        raise _Unplain
    inner = "\n" + indent * (depth + 1) if indent else ""  # "": one line, as separators=(",", ":")
    close = "\n" + indent * depth if indent else ""
    colon = ": " if indent else ":"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return "[" + inner + ("," + inner).join(
            _encode(v, quote, indent, depth + 1) for v in value) + close + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        if not all(isinstance(k, str) for k in value):  # json turns such keys into text: left to it
            raise _Unplain
        return "{" + inner + ("," + inner).join(
            str(quote(k)) + colon + _encode(value[k], quote, indent, depth + 1)
            for k in sorted(value)) + close + "}"
    raise _Unplain


def dumps(value: object, line: bool = False) -> str:
    """``json.dumps(value, indent=2, sort_keys=True)``; ``line``: on one line
    (``separators=(",", ":")``), as a request over a socket is written."""
    quote: Any = None
    try:
        from _json import encode_basestring_ascii as quote
    except ImportError:  # an interpreter without the C accelerator: json.dumps alone
        pass
    if quote is not None:
        try:
            return _encode(value, quote, "" if line else "  ", 0)
        except _Unplain:
            pass
    import json

    if line:
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return json.dumps(value, indent=2, sort_keys=True)
