"""Declarations a script makes about itself in comment lines near its top: ``# key: value``.

Used for ``# long-job: sharded`` (the dispatcher's 2-hour rule) and, later, preflight headers. Only
the leading comment block is read (a shebang, blank lines and ``#`` lines, at most 50 lines), so a
string deep inside a program can never be taken for a declaration.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

MAX_LINES = 50
MAX_BYTES = 64 * 1024


def script_path(argv: Sequence[str]) -> str | None:
    """The script a command runs: CMD itself if it is a text file, else its first argument if that
    is one (``python3 train.py``, ``/usr/bin/bash build.sh``: the interpreter is a binary)."""
    for candidate in list(argv[:2]):
        if os.path.isfile(candidate) and not _is_binary(candidate):
            return candidate
    return None


def _is_binary(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return b"\0" in fh.read(1024)
    except OSError:
        return True


def parse_headers(text: str) -> list[tuple[str, str]]:
    """(key, value) pairs from the leading comment block, keys lower-cased, in order."""
    found = []
    for number, line in enumerate(text.splitlines()):
        if number >= MAX_LINES:
            break
        stripped = line.strip()
        if not stripped or stripped.startswith("#!"):
            continue
        if not stripped.startswith("#"):
            break
        body = stripped.lstrip("#").strip()
        key, sep, value = body.partition(":")
        if sep and key and " " not in key.strip():
            found.append((key.strip().lower(), value.strip()))
    return found


def read_headers(argv: Sequence[str]) -> list[tuple[str, str]]:
    path = script_path(argv)
    if path is None:
        return []
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES)
    except OSError:
        return []
    if b"\0" in data[:1024]:
        return []  # a binary, not a script
    return parse_headers(data.decode("utf-8", errors="replace"))
