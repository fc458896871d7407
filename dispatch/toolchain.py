"""Toolchain probes: run the same commands (``rustc -Vv``, ``cargo -V``, ...) on both hosts and compare.

A build synced to the peer must be built by the same toolchain, or its results mean nothing. A probe
whose program is missing on both sides is fine; missing on one side is a mismatch. Outputs are cached
per probe by the program's path, size and mtime, so an unchanged toolchain costs a ``stat``, not a run.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess

from dispatch.atomicfile import write_atomic
from dispatch.errors import HostrunError
from dispatch.exitcodes import ExitCode

MYPY = False
if MYPY:
    from typing import Any

PROBE_TIMEOUT = 30.0


class ToolchainMismatchError(HostrunError):
    exit_code = ExitCode.TOOLCHAIN_MISMATCH


def _fingerprint(binary: str) -> str:
    st = os.stat(binary)
    return f"{os.path.realpath(binary)}:{st.st_size}:{st.st_mtime_ns}"


def probe_here(probes: list[str], cache_dir: str) -> dict[str, dict[str, Any]]:
    """Run each probe on this machine (or take its cached output)."""
    cache_path = os.path.join(cache_dir, "toolchain-probes.json")
    try:
        with open(cache_path, encoding="utf-8") as fh:
            cache: dict[str, Any] = json.load(fh)
    except (OSError, ValueError):
        cache = {}
    results: dict[str, dict[str, Any]] = {}
    changed = False
    for probe in probes:
        argv = shlex.split(probe)
        binary = shutil.which(argv[0]) if argv else None
        if binary is None:
            results[probe] = {"found": False, "output": None}
            continue
        fingerprint = _fingerprint(binary)
        cached = cache.get(probe)
        if cached and cached.get("fingerprint") == fingerprint:
            results[probe] = {"found": True, "output": cached["output"]}
            continue
        try:
            proc = subprocess.run([binary, *argv[1:]], capture_output=True, text=True,
                                  timeout=PROBE_TIMEOUT, check=False)
            output = (proc.stdout + proc.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            output = f"<probe failed: {exc}>"
        results[probe] = {"found": True, "output": output}
        cache[probe] = {"fingerprint": fingerprint, "output": output}
        changed = True
    if changed:
        try:
            os.makedirs(cache_dir, mode=0o700, exist_ok=True)
            write_atomic(cache_path, json.dumps(cache).encode())
        except OSError:
            pass
    return results


def compare(local: dict[str, dict[str, Any]], remote: dict[str, dict[str, Any]], peer: str) -> list[str]:
    """The differences, one line each ("" when the toolchains agree)."""
    lines: list[str] = []
    for probe in local:
        mine, theirs = local[probe], remote.get(probe, {"found": False, "output": None})
        if not mine["found"] and not theirs["found"]:
            continue
        if mine["found"] != theirs["found"]:
            where = "here" if mine["found"] else peer
            lines.append(f"{probe}: found only {where}")
            continue
        ours = (mine["output"] or "").splitlines()
        others = (theirs["output"] or "").splitlines()
        for i in range(max(len(ours), len(others))):
            a = ours[i] if i < len(ours) else "<nothing>"
            b = others[i] if i < len(others) else "<nothing>"
            if a != b:
                lines.append(f"{probe}: here {a!r} / {peer} {b!r}")
    return lines
