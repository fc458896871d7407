"""Facts about this machine: a file to read plus a pure parser, testable on recorded outputs."""

from __future__ import annotations

import os

from dispatch.records import NamedTuple


class MemInfo(NamedTuple):
    total: int
    available: int


def parse_meminfo(text: str) -> MemInfo:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return MemInfo(total=values["MemTotal"], available=values.get("MemAvailable", values["MemFree"]))


def read_meminfo() -> MemInfo:
    with open("/proc/meminfo", encoding="ascii") as fh:
        return parse_meminfo(fh.read())


def parse_loadavg(text: str) -> tuple[float, float, float]:
    a, b, c = text.split()[:3]
    return float(a), float(b), float(c)


def read_loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg", encoding="ascii") as fh:
        return parse_loadavg(fh.read())


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
