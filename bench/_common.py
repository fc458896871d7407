"""Helpers shared by the benchmarks (standard library only): finding hostrun, a private config and
state dir, the slice cgroup under this process's own memory cgroup, and leak checks."""

from __future__ import annotations

import collections
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Any

MEMORY_MOUNT = "/sys/fs/cgroup/memory"


def find_hostrun(explicit: str | None) -> str:
    path = explicit or os.path.join(os.path.dirname(sys.executable), "hostrun")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        sys.exit(f"bench: hostrun not found at {path} (use --hostrun PATH or run with the venv python)")
    return os.path.abspath(path)


def interpreter_of(script: str) -> str:
    """The Python a console script runs on (its ``#!`` line), else this interpreter."""
    try:
        with open(script, "rb") as fh:
            first = fh.readline().decode("utf-8", "replace").strip()
    except OSError:
        return sys.executable
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and os.path.basename(parts[0]) != "env" and os.access(parts[0], os.X_OK):
            return parts[0]
    return sys.executable


def startup_hooks(python: str) -> str:
    """The ``.pth`` files in ``python``'s site-packages that run code at every start (a plain
    ``pip install -e`` adds an import-hook finder: ~20 ms here, paid by ``python -c pass`` too, so it
    shrinks every ratio against that baseline; ``scripts/setup`` installs in compat mode, without one)."""
    import subprocess

    code = ("import site, os\n"
            "for d in site.getsitepackages():\n"
            "    for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:\n"
            "        if n.endswith('.pth') and n != 'distutils-precedence.pth':\n"
            "            lines = open(os.path.join(d, n)).read().splitlines()\n"
            "            if any(l.startswith('import') for l in lines): print(n)\n")
    found = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
    if not found:
        return "none (baseline is a bare interpreter start)"
    return f"{', '.join(found)} -- WARNING: they run in every start, baseline included; ratios are flattered"


def own_memory_cgroup() -> str | None:
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return path
    return None


def write_config(tmp: str, slice_size: str) -> tuple[str, str | None]:
    """A private config; returns (config path, slice cgroup directory or None)."""
    cgroup = own_memory_cgroup()
    slice_rel = f"{(cgroup or '').rstrip('/')}/hostrun-bench-{os.getpid()}" if cgroup else None
    lines = [f'state_dir = "{tmp}/state"', "", "[hosts.local]", f'slice = "{slice_size}"']
    if slice_rel:
        lines.append(f'cgroup = "{slice_rel}"')
    path = os.path.join(tmp, "hosts.toml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    slice_dir = MEMORY_MOUNT + slice_rel if slice_rel and os.path.isdir(MEMORY_MOUNT) else None
    return path, slice_dir


def engines(state_dir: str) -> list[int]:
    """The admission engine processes of ``state_dir`` (dispatch.local.engine.admitd)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"dispatch.local.engine.admitd" in argv and state_dir.encode() in argv:
            found.append(int(name))
    return found


def private_env(tmp: str) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # hostrun's config cache goes here
    env.pop("HOSTRUN_CONFIG", None)
    return env


def leftovers(state_dir: str, slice_dir: str | None) -> list[str]:
    """Bookings, cgroups and processes left behind on this host (empty when all was cleaned up)."""
    return ledger_leftovers(state_dir, "local") + cgroup_leftovers(slice_dir, "local")


def remove_slice(slice_dir: str | None) -> None:
    """rmdir the slice and any (empty) job cgroups under it, deepest first."""
    if not slice_dir or not os.path.isdir(slice_dir):
        return
    deadline = time.monotonic() + 5.0
    while True:
        try:
            for dirpath, _, _ in sorted(os.walk(slice_dir), key=lambda w: -w[0].count("/")):
                if os.path.isdir(dirpath):
                    os.rmdir(dirpath)
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                print(f"bench: warning: could not remove {slice_dir}: {exc}", file=sys.stderr)
                return
            time.sleep(0.1)


def ledger_leftovers(state_dir: str, who: str) -> list[str]:
    found: list[str] = []
    db = os.path.join(state_dir, "ledger.sqlite3")
    if os.path.exists(db):
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            try:
                rows = conn.execute("SELECT id, state, label, pid, size FROM bookings").fetchall()
            finally:
                conn.close()
            found += [f"{who}: ledger booking left: id={r[0]} state={r[1]} label={r[2]} pid={r[3]} "
                      f"size={r[4]}" for r in rows]
        except sqlite3.Error as exc:
            if "no such table" not in str(exc):
                found.append(f"{who}: could not read ledger {db}: {exc}")
    return found


def cgroup_leftovers(slice_dir: str | None, who: str) -> list[str]:
    found: list[str] = []
    if slice_dir and os.path.isdir(slice_dir):
        for dirpath, dirnames, _ in os.walk(slice_dir):
            for name in dirnames:
                found.append(f"{who}: cgroup left: {os.path.join(dirpath, name)}")
            try:
                with open(os.path.join(dirpath, "cgroup.procs"), encoding="utf-8") as fh:
                    pids = fh.read().split()
            except OSError:
                pids = []
            if pids:
                found.append(f"{who}: processes left in {dirpath}: {' '.join(pids)}")
    return found


def sources_digest(root: str) -> str:
    """Names, sizes and mtimes of ROOT/dispatch/**.py: the agent's name changes with them."""
    parts = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "dispatch")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            st = os.stat(os.path.join(dirpath, name))
            parts.append(f"{dirpath}/{name}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def ratio_table(times: dict[str, list[float]], labels: list[str], width: int,
                base_label: str = "python -c pass") -> float:
    """Print median, p10, p90 (ms) and the ratio to ``base_label``'s median for each series; return
    that baseline median (seconds)."""
    print(f"  {'':{width}} {'median':>7} {'p10':>7} {'p90':>7} {'ratio':>6}")
    base = statistics.median(times[base_label])
    for label in labels:
        v = times[label]
        med = statistics.median(v)
        print(f"  {label[:width]:{width}} {med * 1000:7.1f} {pct(v, 10) * 1000:7.1f} "
              f"{pct(v, 90) * 1000:7.1f} {med / base:5.2f}x")
    return base


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end at the same instant as a start closes first)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = best = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    return best


# -- a swarm of runs (bench_swarm, bench_engine_kill) ---------------------------------------------
def swarm_arguments(p: Any, jobs: int, batch_pause: float) -> None:
    """The options that shape a swarm: how many runs, the slice's slots, each run's cap and sleep,
    how they are launched, and which hostrun."""
    p.add_argument("--jobs", type=int, default=jobs)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--cap-mib", type=int, default=64)
    p.add_argument("--sleep", type=float, default=0.2)
    p.add_argument("--batch", type=int, default=40)
    p.add_argument("--batch-pause", type=float, default=batch_pause)
    p.add_argument("--hostrun", help="hostrun executable (default: .venv/bin/hostrun)")


def launch_swarm(procs: list[subprocess.Popen[bytes]], base: list[str], env: dict[str, str], tmp: str,
                 args: Any, label: str) -> list[str]:
    """``args.jobs`` runs of ``hostrun -m CAP --label LABEL-I -- sh -c 'date >> ts; sleep S; date >> ts'``,
    ``args.batch`` at a time, appended to ``procs`` as they start (the caller's clean-up sees every
    one); their stamp files. Each one's stderr goes to ``tmp/err-I`` (``failure_lines``)."""
    stamps = [os.path.join(tmp, f"ts-{i}") for i in range(args.jobs)]
    for i in range(args.jobs):
        with open(os.path.join(tmp, f"err-{i}"), "wb") as err:
            procs.append(subprocess.Popen(
                [*base, "-m", f"{args.cap_mib}M", "--label", f"{label}-{i}", "--", "sh", "-c",
                 f'date +%s.%N >> "$1"; sleep {args.sleep}; date +%s.%N >> "$1"', "job", stamps[i]],
                env=env, stdout=subprocess.DEVNULL, stderr=err))
        if (i + 1) % args.batch == 0:
            time.sleep(args.batch_pause)
    return stamps


def stamp_times(path: str) -> list[float]:
    """The times a swarm run wrote (its start and its end, once it ran once)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [float(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


def failure_lines(tmp: str, procs: list[subprocess.Popen[bytes]]) -> collections.Counter[str]:
    """The last stderr line of each swarm run that failed, counted."""
    said: collections.Counter[str] = collections.Counter()
    for i, proc in enumerate(procs):
        if proc.returncode:
            with open(os.path.join(tmp, f"err-{i}"), encoding="utf-8", errors="replace") as fh:
                lines = fh.read().strip().splitlines()
            said[(lines[-1] if lines else "no output")[:150]] += 1
    return said
