"""Text that crosses sessions: names one session chooses and another session's terminal prints.

Labels, session names and group names are written by one user and shown to others (in ``waiting:``
lines, ``hostrun ledger``, reports, alerts). A newline or an escape sequence in one of them could forge
a ``hostrun: exit 250`` line or recolour someone else's terminal. So names are refused when they carry
control characters (``check_name``, exit 2), and every foreign text is escaped where it is printed
(``printable``), since a ledger row or a peer's report may come from an older or hostile writer.
"""

from __future__ import annotations

from dispatch.core.errors import UsageError

# Bidirectional overrides and isolates reorder what a terminal shows ("Trojan source"); line and
# paragraph separators break lines in some terminals. Treated as control characters here.
_INVISIBLE = frozenset("\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e"
                       "\u2066\u2067\u2068\u2069\ufeff")


def _is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code < 0xE000 or ch in _INVISIBLE


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): show the byte
        return f"\\x{code - 0xDC00:02x}"
    if ch in "\n\t\r":
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character, invisible reordering mark and undecodable byte
    written as a visible escape (``\\n``, ``\\x1b``, ``\\u202e``, ``\\xff``), so it cannot start a
    line, move the cursor or reorder what a terminal shows. Idempotent, so a message escaped once
    can be printed through another escaping printer. Plain text comes back unchanged."""
    if text.isprintable() and not any(ch in _INVISIBLE for ch in text):
        return text
    return "".join(_escape(ch) if _is_control(ch) else ch for ch in text)


def storable(text: str) -> str:
    """``text`` with the bytes that were not UTF-8 (an argument decoded with surrogateescape, as
    Python does on Linux) written as ``\\xNN``: SQLite stores only valid text, and a person reads it.
    Unlike ``printable`` it keeps control characters: what is stored is escaped where it is shown."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_name(value: str | None, what: str) -> str | None:
    """``value`` unchanged, or UsageError (exit 2) if it holds a control character.

    ``what`` names the option in the message (``--label``, ``HOSTRUN_SESSION``, ...).
    """
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{what}: must not be empty")
    bad = next((ch for ch in value if _is_control(ch)), None)
    if bad is not None:
        raise UsageError(f"{what} {printable(value)!s}: control character {_escape(bad)} not allowed "
                         "(names are printed in other sessions' output)")
    return value
