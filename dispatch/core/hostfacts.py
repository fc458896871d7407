"""Facts about this machine: a file to read plus a pure parser, testable on recorded outputs."""

from __future__ import annotations

import os

from dispatch.core.records import NamedTuple


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
    with open("/proc/meminfo", encoding="utf-8") as fh:
        return parse_meminfo(fh.read())


def parse_loadavg(text: str) -> tuple[float, float, float]:
    a, b, c = text.split()[:3]
    return float(a), float(b), float(c)


def read_loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg", encoding="utf-8") as fh:
        return parse_loadavg(fh.read())


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one directory per GPU (its PCI address) the driver has
NVIDIA_PROC_ENV = "HOSTRUN_NVIDIA_PROC"  # test hook: a directory read instead of NVIDIA_GPUS


def has_nvidia_gpus() -> bool:
    """Whether the NVIDIA driver has a GPU here: one directory read, asked for every job, so never
    nvidia-smi (tens of ms or worse). The driver makes an entry per GPU under /proc/driver/nvidia/gpus,
    also inside containers given GPUs; device nodes such as /dev/nvidia0 are created lazily and can be
    numbered otherwise. ``HOSTRUN_NVIDIA_PROC`` names another directory instead (a test hook)."""
    path = os.environ.get(NVIDIA_PROC_ENV) or NVIDIA_GPUS
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except OSError:
        return False
