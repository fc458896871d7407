"""Locating cgroup hierarchies: pure parsers of /proc/self/cgroup and /proc/self/mountinfo; and
where a shared slice's daemon listens (``dispatch.capping.shared``), which the backend choice looks
at before it imports that client."""

from __future__ import annotations

import os

SLICE_NAME = "hostrun"
SOCKET_DIR = "/run/hostrun"
SOCKET_PATH = SOCKET_DIR + "/shared.sock"
SOCKET_ENV = "HOSTRUN_SHARED_SOCKET"  # where the daemon listens, for a test's own daemon
_OCTAL = frozenset("01234567")


def _unescape(field: str) -> str:
    """The kernel writes space, tab, newline and backslash in mountinfo paths as ``\\040`` etc.

    Decoded by hand, not with ``re``: this runs on every job's path, and importing ``re`` costs ~2 ms.
    """
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        digits = field[i + 1 : i + 4]
        if field[i] == "\\" and len(digits) == 3 and set(digits) <= _OCTAL:
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map controller name (``memory``, or ``""`` for the v2 unified line) to the cgroup path."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            result[""] = path
        for ctl in controllers.split(","):
            if ctl:
                result[ctl] = path
    return result


def parse_mountinfo(text: str) -> dict[str, str]:
    """Map ``memory`` (v1 memory controller) and ``cgroup2`` to their mount points."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mount_point, fstype, super_opts = _unescape(fields[4]), rfields[0], rfields[2]
        if fstype == "cgroup2":
            result.setdefault("cgroup2", mount_point)
        elif fstype == "cgroup" and "memory" in super_opts.split(","):
            result.setdefault("memory", mount_point)
    return result


def default_slice_path(own_cgroup: str) -> str:
    """The slice as a child of the cgroup hostrun runs in, or the same slice when run from a job.

    A hostrun started inside a hostrun job (its cgroup is ``…/hostrun/job-…``) must find the same slice,
    not nest a new one inside the job.
    """
    parts = [p for p in own_cgroup.split("/") if p]
    if SLICE_NAME in parts:
        parts = parts[: parts.index(SLICE_NAME)]
    return "/" + "/".join([*parts, SLICE_NAME])


def read_self_files() -> tuple[str, str]:
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        cgroup = fh.read()
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mountinfo = fh.read()
    return cgroup, mountinfo


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or SOCKET_PATH
