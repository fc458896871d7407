"""Alerts: one JSON line each, appended to ``alert_file`` when something needs the main session's
decision (e.g. "job X waits here; the peer could take it now"). hostrun never moves a job itself.

The file is created private to its owner; each alert is one ``write`` on an ``O_APPEND`` descriptor,
so concurrent writers never interleave their lines.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

MYPY = False
if MYPY:
    from typing import Any


def append(path: str, record: dict[str, Any]) -> None:
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    line = json.dumps({"time": time.time(), **record}, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_all(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def follow(path: str, poll: float = 0.2, from_start: bool = False) -> Iterator[dict[str, Any]]:
    """Yield alerts as they are appended (forever). Starts at the end unless ``from_start``."""
    position = 0 if from_start else (os.path.getsize(path) if os.path.exists(path) else 0)
    partial = b""
    while True:
        try:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < position:
                    position = 0  # truncated or replaced
                fh.seek(position)
                data = fh.read()
                position = fh.tell()
        except FileNotFoundError:
            data = b""
        if data:
            partial += data
            *lines, partial = partial.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)
        else:
            time.sleep(poll)
