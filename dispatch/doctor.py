"""``hostrun doctor``: which memory-cap backend is active, where the slice is, what the others lack."""

from __future__ import annotations

import os
import sys
from typing import Any

from dispatch import __version__
from dispatch.capping import probe_all, select_backend
from dispatch.errors import BackendError
from dispatch.hostfacts import read_meminfo
from dispatch.settings import Settings


def diagnose(settings: Settings) -> dict[str, Any]:
    host = settings.local
    mem = read_meminfo()
    problems: list[str] = []
    try:
        backend = select_backend(host, mem.total)
        active, slice_path = backend.name, backend.describe()
    except BackendError as exc:
        active, slice_path = "none", ""
        problems.append(str(exc))
    if active == "none" and host.backend == "none":
        problems.append("backend forced to none by the configuration: jobs run only with --no-cap")
    elif active == "none":
        problems.append("no memory-cap backend works here: jobs run only with --no-cap")
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "config": settings.source,
        "state_dir": settings.state_dir,
        "ledger": os.path.join(settings.state_dir, "ledger.sqlite3"),
        "backend": active,
        "forced_backend": host.backend,
        "slice": slice_path,
        "slice_limit": host.slice_limit(mem.total),
        "memory_total": mem.total,
        "heavy_threads": host.threads(),
        "probes": [{"backend": name, "ok": p.ok, "detail": p.detail} for name, p in probe_all(host)],
        "problems": problems,
    }
