#!/usr/bin/env python3
"""A swarm: ``--jobs`` (1,000) concurrent submissions queued behind a full slice, as a session fanning
out subagents produces. What happens to each, what waiting costs, and how fast the queue drains.

What is measured
----------------
A holder (``hostrun -m SLICE -- sleep``) fills a private slice of ``--slots`` (8) x ``--cap-mib`` (64)
MiB. Then ``--jobs`` ``hostrun -m 64M --label swarm-I -- sh -c 'date >> ts; sleep 0.2; date >> ts'``
are started ``--batch`` (40) at a time (``--batch-pause`` between batches) until all are launched
and waiting; the holder then ends and the swarm drains.

* **outcomes**: exit codes (all must be 0: a 78 ``database is locked`` is a submission lost), and that
  each job ran exactly once (its stamp file has one start and one end);
* **never more booked than the slice**: the most jobs running at once, from the stamps (<= slots);
* **what waiting costs**, sampled while all wait: hostrun processes per waiting job, their PSS
  (``/proc/PID/smaps_rollup``) per waiting job, and their CPU per waiting job per second over
  ``--idle-window`` seconds;
* **drain**: from the holder's end to the last exit, against the ideal ``jobs x sleep / slots``
  (1,000 x 0.2 / 8 = 25 s).

Baselines, in the same run: the floor of a waiting client, ``--floor`` (200) bare ``python3 -I`` that
import ``socket, os, sys, time`` and sleep (their PSS each); and, where task-spooler is installed
(``tsp``), the same swarm queued with ``tsp -S SLOTS`` (its jobs never capped): queue time, drain,
its server's RSS.

Targets (issue 38): every job runs once, none 78; drain <= 2x the ideal; <= 4 MiB PSS per waiting job.
``--park no`` keeps every waiting run whole (``HOSTRUN_PARK=0``), for the figures before parking.
Run by hand as root on a cgroup v1 (or v2) machine, e.g.::

    .venv/bin/python bench/bench_swarm.py --jobs 1000
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from _common import (
    engines,
    failure_lines,
    find_hostrun,
    interpreter_of,
    launch_swarm,
    leftovers,
    max_overlap,
    private_env,
    remove_slice,
    stamp_times,
    swarm_arguments,
    write_config,
)

TARGET_DRAIN = 2.0
TARGET_PSS_MIB = 4.0


def _pss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _cpu_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(roots: list[int]) -> list[int]:
    """Every live process below ``roots`` (the roots included), from /proc's parent links."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        if os.path.exists(f"/proc/{pid}"):
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _engine_of(state_dir: str) -> int | None:
    """The admission engine of ``state_dir`` (its CPU during the drain is the queue's own cost)."""
    found = engines(state_dir)
    return found[0] if found else None


def _parked(pid: int) -> bool:
    """A waiting run parked (dispatch/local/engine/park.py): its process runs parked.py."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return any(arg.endswith(b"/parked.py") for arg in fh.read().split(b"\0"))
    except OSError:
        return False


def park_after(env: dict[str, str]) -> float:
    """Seconds a run waits far from its turn before it parks (the hostrun measured: on sys.path)."""
    try:
        from dispatch.local.engine.park import park_after as after
    except ImportError:  # a hostrun from before park-after: it parks at the engine's first word
        return 0.0
    return float(after(env))


def floor_pss(python: str, count: int) -> float:
    """MiB of PSS per bare interpreter that imports what a waiting client needs and sleeps."""
    procs = [subprocess.Popen([python, "-I", "-c", "import socket, os, sys, time; time.sleep(60)"])
             for _ in range(count)]
    try:
        time.sleep(2.0)
        sizes = [s for s in (_pss_kib(p.pid) for p in procs) if s is not None]
        return sum(sizes) / max(len(sizes), 1) / 1024
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def task_spooler(jobs: int, slots: int, sleep: float, tmp: str) -> str:
    tsp = shutil.which("tsp") or shutil.which("ts")
    if tsp is None:
        return "task-spooler: not installed here (apt-get install task-spooler): not measured"
    env = {**os.environ, "TS_SOCKET": os.path.join(tmp, "tsp.socket"), "TS_MAXFINISHED": str(jobs + 10),
           "TMPDIR": tmp}
    subprocess.run([tsp, "-S", str(slots)], env=env, check=True)
    started = time.monotonic()
    for _ in range(jobs):
        subprocess.run([tsp, "sh", "-c", f"sleep {sleep}"], env=env, check=True, stdout=subprocess.DEVNULL)
    queued = time.monotonic() - started
    server = subprocess.run(["pgrep", "-f", "-n", f"^{tsp}"], capture_output=True, text=True).stdout.split()
    rss = "?"
    if server:
        with open(f"/proc/{server[0]}/status", encoding="utf-8") as fh:
            rss = next((ln.split()[1] for ln in fh if ln.startswith("VmRSS:")), "?")
    subprocess.run([tsp, "-w"], env=env, check=False)
    while "running" in subprocess.run([tsp], env=env, capture_output=True, text=True).stdout:
        time.sleep(0.1)
    drained = time.monotonic() - started
    subprocess.run([tsp, "-K"], env=env, check=False)
    return (f"task-spooler (tsp -S {slots}): {jobs} queued in {queued:.1f} s, all done {drained:.1f} s "
            f"after the first; its server {rss} KiB RSS")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    swarm_arguments(p, jobs=1000, batch_pause=0.5)
    p.add_argument("--idle-window", type=float, default=5.0)
    p.add_argument("--floor", type=int, default=200, help="bare interpreters for the PSS floor")
    p.add_argument("--timeout", type=float, default=1800, help="give up on the drain after this")
    p.add_argument("--park", choices=("yes", "no"), default="yes",
                   help="waiting runs far from their turn park (the default), or stay whole (HOSTRUN_PARK=0)")
    args = p.parse_args()
    hostrun = find_hostrun(args.hostrun)
    python = interpreter_of(hostrun)
    slice_mib = args.slots * args.cap_mib
    tmp = tempfile.mkdtemp(prefix="hostrun-swarm-")
    config, slice_dir = write_config(tmp, f"{slice_mib}M")
    env = private_env(tmp)
    env["HOSTRUN_PARK"] = "1" if args.park == "yes" else "0"
    base = [hostrun, "--config", config]
    procs: list[subprocess.Popen[bytes]] = []
    failed: list[str] = []
    try:
        subprocess.run([*base, "--", "true"], env=env, check=True, capture_output=True)
        holder = subprocess.Popen([*base, "-m", f"{slice_mib}M", "--label", "holder", "--", "sleep", "3600"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)
        launch_started = time.monotonic()
        stamps = launch_swarm(procs, base, env, tmp, args, "swarm")
        launched = time.monotonic() - launch_started
        # Sampled once the last runs launched have waited long enough to park (a run parks only
        # after HOSTRUN_PARK_AFTER seconds far from its turn): what a long wait holds.
        time.sleep(2.0 + (park_after(env) if args.park == "yes" else 0.0))
        waiting = [p for p in procs if p.poll() is None]
        tree = _descendants([p.pid for p in waiting])
        pss = sum(s for s in (_pss_kib(pid) for pid in tree) if s is not None) / 1024
        parked = sum(1 for p in waiting if _parked(p.pid))
        cpu0 = sum(t for t in (_cpu_ticks(pid) for pid in tree) if t is not None)
        time.sleep(args.idle_window)
        cpu1 = sum(t for t in (_cpu_ticks(pid) for pid in tree) if t is not None)
        per_s = (cpu1 - cpu0) / os.sysconf("SC_CLK_TCK") / args.idle_window
        gone_early = collections.Counter(p.returncode for p in procs if p.returncode is not None)
        engine = _engine_of(os.path.join(tmp, "state"))
        engine_cpu0 = _cpu_ticks(engine) if engine else None
        holder.terminate()
        holder.wait()
        drain_started = time.monotonic()
        done = threading.Event()

        def _wait_all() -> None:
            for proc in procs:
                proc.wait()
            done.set()

        threading.Thread(target=_wait_all, daemon=True).start()
        if not done.wait(args.timeout):
            failed.append(f"the swarm did not drain within {args.timeout:g} s")
            for proc in procs:
                proc.kill()
            done.wait(60)
        drain = time.monotonic() - drain_started
        engine_cpu1 = _cpu_ticks(engine) if engine else None
        engine_cpu = ((engine_cpu1 - engine_cpu0) / os.sysconf("SC_CLK_TCK")
                      if engine_cpu0 is not None and engine_cpu1 is not None else None)
        codes = collections.Counter(p.returncode for p in procs)
        runs = [stamp_times(s) for s in stamps]
        once = sum(1 for r in runs if len(r) == 2)
        twice = sum(1 for r in runs if len(r) > 2)
        never = sum(1 for r in runs if not r)
        overlap = max_overlap([(r[0], r[1]) for r in runs if len(r) == 2])
        said = failure_lines(tmp, procs)
        ideal = args.jobs * args.sleep / args.slots
        floor = floor_pss(python, args.floor)
        per_waiter = pss / max(len(waiting), 1)
        print(f"swarm: {args.jobs} x hostrun -m {args.cap_mib}M -- sh -c '...; sleep {args.sleep}' behind a "
              f"holder of the whole {slice_mib} MiB slice ({args.slots} slots), launched {args.batch} at a "
              f"time in {launched:.1f} s; park {args.park}; load before the "
              f"drain {os.getloadavg()[0]:.1f}")
        print(f"  ended before the holder: {dict(gone_early) or 'none'}")
        print(f"  waiting while the slice was full: {len(waiting)} jobs, {len(tree)} processes "
              f"({len(tree) / max(len(waiting), 1):.1f} per job), {parked} of them parked")
        print(f"  PSS per waiting job: {per_waiter:.1f} MiB (floor, a bare python3 -I with socket/os/sys/"
              f"time: {floor:.1f} MiB; {per_waiter / floor:.1f}x); all waiters {pss:.0f} MiB")
        print(f"  CPU per waiting job: {per_s / max(len(waiting), 1) * 1000:.2f} ms per second")
        print(f"  exit codes: {dict(sorted(codes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))}")
        for line, count in said.most_common(5):
            print(f"    {count} x {line}")
        print(f"  ran exactly once: {once}, more than once: {twice}, never: {never}; most at once: {overlap} "
              f"(slots {args.slots})")
        spent = f"{engine_cpu:.1f} s" if engine_cpu is not None else "not found"
        print(f"  drain: {drain:.1f} s, ideal {ideal:.1f} s: {drain / ideal:.2f}x; the admission engine's "
              f"CPU during it: {spent}")
        print("  " + task_spooler(args.jobs, args.slots, args.sleep, tmp))
        checks = [(f"every job ran once, none failed ({codes.get(0, 0)} of {args.jobs} exit 0)",
                   codes.get(0, 0) == args.jobs and once == args.jobs),
                  (f"never more running than the slots ({overlap} <= {args.slots})", overlap <= args.slots),
                  (f"drain <= {TARGET_DRAIN}x ideal ({drain / ideal:.2f}x)", drain <= TARGET_DRAIN * ideal),
                  (f"PSS per waiting job <= {TARGET_PSS_MIB} MiB ({per_waiter:.1f})",
                   per_waiter <= TARGET_PSS_MIB)]
        for text, ok in checks:
            print(f"  {'PASS' if ok else 'FAIL'} {text}")
            if not ok:
                failed.append(text)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        left = leftovers(os.path.join(tmp, "state"), slice_dir)
        for line in left:
            print(f"  FAIL left behind: {line}")
        failed += left
        remove_slice(slice_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
