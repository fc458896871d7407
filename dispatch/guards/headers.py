"""Declarations a script makes about itself in comment lines near its top: ``# key: value``.

Used for ``# long-job: sharded`` (the dispatcher's 2-hour rule) and the preflight headers
(``# admission:``, ``# run-condition:``; see ``dispatch.local.run.preflight``). Only
the leading comment block is read (a shebang, blank lines and ``#`` lines, at most 50 lines), so a
string deep inside a program can never be taken for a declaration.
"""

from __future__ import annotations

import os

MYPY = False
if MYPY:
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


def parse_numbered(text: str) -> list[tuple[int, str, str]]:
    """(line number counting from 1, key, value) from the leading comment block, keys lower-cased."""
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
            found.append((number + 1, key.strip().lower(), value.strip()))
    return found


def parse_headers(text: str) -> list[tuple[str, str]]:
    """(key, value) pairs from the leading comment block, keys lower-cased, in order."""
    return [(key, value) for _, key, value in parse_numbered(text)]


def read_script(argv: Sequence[str]) -> tuple[str, str] | None:
    """(path, leading text) of the script a command runs; None for no script file or a binary."""
    path = script_path(argv)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES)
    except OSError:
        return None
    if b"\0" in data[:1024]:
        return None  # a binary, not a script
    return path, data.decode("utf-8", errors="replace")


def read_headers(argv: Sequence[str]) -> list[tuple[str, str]]:
    found = read_script(argv)
    return [] if found is None else parse_headers(found[1])


PREFLIGHT_KEYS = frozenset({"admission", "run-condition"})


def declares_preflight(argv: Sequence[str]) -> bool:
    """Whether the script ``argv`` runs has ``# admission:``/``# run-condition:`` headers: the cheap
    test that keeps ``dispatch.local.run.preflight`` off the path of every other command."""
    found = read_script(argv) if argv else None
    return found is not None and any(key in PREFLIGHT_KEYS for _, key, _ in parse_numbered(found[1]))
