#!/usr/bin/env python3
"""Many concurrent ``hostrun`` jobs on a slice that fits only a few: throughput and zero overbooking.

What is measured
----------------
``--jobs`` (50) ``hostrun -m CAP -- sh -c 'date >> ts; sleep S; date >> ts'`` processes are started at
once on a private slice of exactly ``--parallel`` (5) x ``--cap-mib`` (100 MiB) = 500 MiB, so at most 5
fit at a time. Each job writes its own start and end timestamp (``date +%s.%N``) to its own file.

* wall time from the first launch to the last exit, against the ideal ``jobs / parallel x sleep``
  (50 / 5 x 0.2 s = 2.0 s): target ratio <= 1.2x; ``--large``: 100 jobs x 0.3 s on a slice of 10
  (ideal 3.0 s), target <= 1.3x;
* overbooking, two independent ways; both must hold:
  - from the jobs' own timestamps, the maximum number of jobs running at once (<= parallel);
  - by polling the ledger (``state_dir/ledger.sqlite3``, table ``bookings``, ``state='running'``)
    from this process every ``--poll-ms`` (10 ms): the maximum number and the maximum total size of
    running bookings (<= slice size);
* the exit codes of all jobs (all must be 0), and each job's booking kind and size (its
  ``--result-file``);
* leftovers once all jobs ended: bookings in the ledger, job cgroups or processes in the slice;
* with ``--idle-waiters N``: the CPU that waiting itself costs, read from /proc over
  ``--idle-window`` seconds while N jobs wait behind one that holds the whole slice.

Every job gets its own ``--label`` by default, so each is booked at its cap (100 MiB) and the slice
really fits only ``parallel`` of them. With ``--shared-label`` all jobs share one label: after the first
run the label has a recorded peak (a few hundred KiB for ``sh``/``sleep``), later jobs are booked at that
peak (kind ``peak``), and many more than ``parallel`` may legitimately run at once; then only the
booked-bytes check is a target, the job count is informational.

Baseline, in the same run: the same ``jobs`` job commands with plain Python, ``parallel`` at a time
(a pool of ``parallel`` threads each running ``subprocess.run``), no hostrun. Floor, in the same run:
``jobs`` bare ``python3 -I -S`` processes launched at once as hostrun's are, each taking a token of a
jobserver (a FIFO holding ``parallel`` bytes, as GNU make's), running its job and giving the token
back: what any design whose waiting clients are Python processes pays on these cores.

Isolation: a private temporary config (own ``state_dir``, own slice cgroup
``<this process's memory cgroup>/hostrun-bench-<pid>``, own ``XDG_CACHE_HOME``), passed with
``--config``; removed in a ``finally`` block. One warm-up ``hostrun -- true`` validates and caches the
config first (not timed). ``--cached-bytecode`` runs hostrun with a private bytecode cache
(``PYTHONPYCACHEPREFIX``, ``PYTHONDONTWRITEBYTECODE`` unset; filled by the warm-up), to show the cost
where hostrun's ``.pyc`` files exist, when the environment otherwise prevents writing them.

Standard library only. Run by hand as root on a cgroup v1 (or v2) machine, e.g.::

    .venv/bin/python bench/bench_concurrency.py --jobs 50 --parallel 5
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from _common import (
    find_hostrun,
    interpreter_of,
    leftovers,
    max_overlap,
    private_env,
    remove_slice,
    write_config,
)

TARGET_RATIO = 1.2  # issue 13: 50 x 0.2 s on a slice of 5
LARGE = {"jobs": 100, "parallel": 10, "sleep": 0.3, "target": 1.3}  # issue 13: --large, on 2 cores
MEMORY_MOUNT = "/sys/fs/cgroup/memory"
MIB = 1 << 20


# ---------------------------------------------------------------- shared setup helpers












def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# ---------------------------------------------------------------- measurement pieces
def job_script(ts_file: str, sleep: float) -> list[str]:
    # The file name goes in as $0-style positional argument: no quoting trouble.
    return ["sh", "-c", f'date +%s.%N >> "$1"; sleep {sleep}; date +%s.%N >> "$1"', "job", ts_file]


def read_intervals(paths: list[str]) -> tuple[list[tuple[float, float]], list[str]]:
    intervals, problems = [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                stamps = [float(x) for x in fh.read().split()]
        except (OSError, ValueError) as exc:
            problems.append(f"{os.path.basename(path)}: unreadable ({exc})")
            continue
        if len(stamps) != 2:
            problems.append(f"{os.path.basename(path)}: {len(stamps)} timestamps, expected 2")
            continue
        intervals.append((stamps[0], stamps[1]))
    return intervals, problems


def level_profile(intervals: list[tuple[float, float]]) -> dict[int, float]:
    """Seconds spent with exactly k jobs running, from the first start to the last end."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    spent: dict[int, float] = collections.defaultdict(float)
    now, last = 0, events[0][0] if events else 0.0
    for t, delta in events:
        spent[now] += t - last
        now, last = now + delta, t
    return dict(sorted(spent.items()))


def handoffs(intervals: list[tuple[float, float]], parallel: int) -> list[float]:
    """Seconds a freed slot stays empty: from the i-th job end to the (parallel + i)-th job start.

    Each end frees one slot and the next job in line takes it, so pairing ends and later starts in
    order measures release -> admission -> cgroup setup -> exec, per slot.
    """
    ends = sorted(e for _, e in intervals)
    starts = sorted(s for s, _ in intervals)
    return [starts[parallel + i] - ends[i] for i in range(len(starts) - parallel)]


class LedgerPoller(threading.Thread):
    """Polls running bookings every ``interval`` s: max count and max total size seen."""

    def __init__(self, db_path: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.db_path, self.interval = db_path, interval
        self.stop_event = threading.Event()
        self.samples = self.errors = 0
        self.max_count = self.max_bytes = 0
        self.max_waiting = 0
        self.first_error = ""

    def run(self) -> None:
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=1.0,
                               check_same_thread=False)
        try:
            while not self.stop_event.is_set():
                try:
                    count, total, waiting = conn.execute(
                        "SELECT count(*) FILTER (WHERE state = 'running'),"
                        " coalesce(sum(size) FILTER (WHERE state = 'running'), 0),"
                        " count(*) FILTER (WHERE state = 'waiting') FROM bookings"
                    ).fetchone()
                    self.samples += 1
                    self.max_count = max(self.max_count, count)
                    self.max_bytes = max(self.max_bytes, total)
                    self.max_waiting = max(self.max_waiting, waiting)
                except sqlite3.Error as exc:
                    self.errors += 1
                    self.first_error = self.first_error or str(exc)
                self.stop_event.wait(self.interval)
        finally:
            conn.close()


def children_cpu() -> float:
    """User + system CPU seconds of all waited-for children so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_baseline(
    jobs: int, parallel: int, sleep: float, outdir: str
) -> tuple[float, list[int], int, float]:
    os.makedirs(outdir)
    paths = [os.path.join(outdir, f"job-{i:03d}.ts") for i in range(jobs)]

    def one(path: str) -> int:
        return subprocess.run(job_script(path, sleep), stdin=subprocess.DEVNULL).returncode

    cpu0 = children_cpu()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        codes = list(pool.map(one, paths))
    wall = time.perf_counter() - t0
    intervals, _ = read_intervals(paths)
    return wall, codes, max_overlap(intervals), children_cpu() - cpu0


# The floor of any design whose waiting clients are Python processes: a bare interpreter that takes
# a token from a jobserver (a FIFO holding ``parallel`` bytes, as GNU make's), runs the job, gives the
# token back. No imports, no cgroup, no booking: what 50 such processes cost on these cores.
FLOOR_CLIENT = (
    "import os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "os.read(fd, 1)\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "status = os.waitpid(pid, 0)[1]\n"
    "os.write(fd, b't')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_floor(python: str, jobs: int, parallel: int, sleep: float, outdir: str
              ) -> tuple[float, list[int], int, float, float]:
    """``jobs`` bare ``python3 -I -S`` clients launched at once as hostrun's are, ``parallel`` tokens
    in a jobserver FIFO: wall, exit codes, most at once, CPU, when the first job started (s)."""
    os.makedirs(outdir)
    fifo = os.path.join(outdir, "jobserver")
    os.mkfifo(fifo, 0o600)
    keep = os.open(fifo, os.O_RDWR)  # the FIFO's tokens live while one end is open
    os.write(keep, b"t" * parallel)
    paths = [os.path.join(outdir, f"job-{i:03d}.ts") for i in range(jobs)]
    cpu0 = children_cpu()
    launch_wall = time.time()
    t0 = time.perf_counter()
    procs = [subprocess.Popen([python, "-I", "-S", "-c", FLOOR_CLIENT, fifo, *job_script(path, sleep)],
                              stdin=subprocess.DEVNULL) for path in paths]
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - t0
    os.close(keep)
    intervals, _ = read_intervals(paths)
    first = min(s for s, _ in intervals) - launch_wall if intervals else 0.0
    return wall, codes, max_overlap(intervals), children_cpu() - cpu0, first


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of one live process (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_waiting(hostrun: str, config: str, env: dict[str, str], state_dir: str, tmp: str,
                 cap_mib: int, waiters: int, window: float, timeout: float) -> bool:
    """CPU that waiting itself costs: one job holds the whole slice while ``waiters`` hostrun jobs
    wait; their CPU is read from /proc over ``window`` seconds once all are queued (and a second
    more, so their start-up is over). Then the holder ends and all must run and exit 0."""
    started, go = os.path.join(tmp, "idle-started"), os.path.join(tmp, "idle-go")
    base = [hostrun, "--config", config, "-m", f"{cap_mib}M"]
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    holder = subprocess.Popen([*base, "--label", "idle-holder", "--", "sh", "-c",
                               'touch "$1"; while [ ! -e "$2" ]; do sleep 0.05; done', "h", started,
                               go], env=env, **quiet)
    procs = []
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        procs = [subprocess.Popen([*base, "--label", f"idle-{i:03d}", "--", "true"], env=env, **quiet)
                 for i in range(waiters)]
        db = sqlite3.connect(f"file:{os.path.join(state_dir, 'ledger.sqlite3')}?mode=ro", uri=True,
                             timeout=5.0)
        try:
            while time.monotonic() < deadline:
                (queued,) = db.execute("SELECT count(*) FROM bookings WHERE state = 'waiting'"
                                       " AND label LIKE 'idle-%'").fetchone()
                if queued == waiters:
                    break
                time.sleep(0.05)
        finally:
            db.close()
        time.sleep(1.0)
        before = sum(proc_cpu(p.pid) for p in procs)
        time.sleep(window)
        spent = sum(proc_cpu(p.pid) for p in procs) - before
        print(f"\nidle waiting: {waiters} waiters queued behind one job holding the slice, "
              f"{window:g} s: {spent * 1000:.0f} ms CPU in all = "
              f"{spent / (waiters * window) * 1000:.2f} ms per waiter per second")
        with open(go, "w", encoding="utf-8"):
            pass
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in [holder, *procs]]
        ok = codes == [0] * (waiters + 1)
        print(f"  then all ran: exit codes {dict(collections.Counter(codes))} -> "
              f"{'PASS' if ok else 'FAIL'}")
        return ok
    finally:
        for p in [holder, *procs]:
            if p.poll() is None:
                p.kill()
                p.wait()


def print_phases(path: str, jobs: int) -> None:
    """The CPU each hostrun spent per phase (bench/_phases.py), median and mean over the jobs."""
    from _phases import PHASES, per_phase

    try:
        count, spent = per_phase(path)
    except (OSError, ValueError) as exc:
        print(f"  CPU per phase: not read ({exc})")
        return
    full = len(spent["start"])
    print(f"  CPU per phase of each hostrun process (ms; {full} of {count} processes of {jobs} "
          "went through every phase; children not included):")
    if not full:
        return
    total = [sum(spent[name][i] for name, _, _ in PHASES) for i in range(full)]
    for name, _, _ in PHASES:
        values = spent[name]
        print(f"    {name:<11} median {statistics.median(values) * 1000:6.1f}  mean "
              f"{statistics.mean(values) * 1000:6.1f}  p90 {pct(values, 90) * 1000:6.1f}")
    print(f"    {'all':<11} median {statistics.median(total) * 1000:6.1f}  mean "
          f"{statistics.mean(total) * 1000:6.1f}")


def print_handoffs(path: str, ts_paths: list[str]) -> None:
    """The hand-off's wall time per step (bench/_phases.py ``handoffs``), from the same marks."""
    from _phases import handoff_lines, handoffs

    stamps = {}
    for ts in ts_paths:
        try:
            with open(ts, encoding="utf-8") as fh:
                values = [float(x) for x in fh.read().split()]
        except (OSError, ValueError):
            continue
        if len(values) == 2:
            stamps[ts] = (values[0], values[1])
    try:
        found = handoffs(path, stamps)
    except (OSError, ValueError, KeyError) as exc:
        print(f"  hand-off steps: not read ({exc})")
        return
    for line in handoff_lines(found):
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, help="concurrent hostrun jobs (default 50; --large 100)")
    ap.add_argument("--parallel", type=int,
                    help="how many jobs the slice fits: slice = parallel x cap (default 5; --large 10)")
    ap.add_argument("--cap-mib", type=int, default=100, help="each job's cap in MiB (default 100)")
    ap.add_argument("--sleep", type=float,
                    help="each job's sleep in seconds (default 0.2; --large 0.3)")
    ap.add_argument("--target", type=float,
                    help=f"wall / ideal target (default {TARGET_RATIO}; --large {LARGE['target']})")
    ap.add_argument("--large", action="store_true",
                    help="100 jobs x 0.3 s on a slice of 10, target 1.3x (issue 13's second case)")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="ledger poll interval (default 10 ms)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="give up on the hostrun jobs after this many seconds (default 120)")
    ap.add_argument("--shared-label", action="store_true",
                    help="give all jobs one label (peak booking after the first; see the docstring)")
    ap.add_argument("--hostrun", metavar="PATH",
                    help="hostrun executable (default: <dir of sys.executable>/hostrun)")
    ap.add_argument("--cached-bytecode", action="store_true",
                    help="run hostrun with a private bytecode cache (PYTHONPYCACHEPREFIX, "
                         "PYTHONDONTWRITEBYTECODE unset), as where its .pyc files exist")
    ap.add_argument("--idle-waiters", type=int, default=0, metavar="N",
                    help="also measure the CPU of N jobs waiting behind one that holds the slice")
    ap.add_argument("--idle-window", type=float, default=3.0,
                    help="seconds over which --idle-waiters reads their CPU (default 3)")
    ap.add_argument("--phases", action="store_true",
                    help="run the timed jobs through bench/_phases.py and print the CPU each hostrun "
                         "spends per phase (start, imports, to the queue, waiting, to exec, ...)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, timestamps)")
    args = ap.parse_args()
    preset = LARGE if args.large else {"jobs": 50, "parallel": 5, "sleep": 0.2, "target": TARGET_RATIO}
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    hostrun = find_hostrun(args.hostrun)
    slice_bytes = args.parallel * args.cap_mib * MIB
    ideal = args.jobs / args.parallel * args.sleep
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-concurrency-")
    slice_dir: str | None = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        config, slice_dir = write_config(tmp, f"{args.parallel * args.cap_mib}M")
        env = private_env(tmp)
        if args.cached_bytecode:
            env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        state_dir = os.path.join(tmp, "state")
        print(f"hostrun:      {hostrun}")
        print(f"config:       {config} (state_dir {state_dir})")
        print(f"slice cgroup: {slice_dir or '(hostrun default)'}")
        print(f"slice:        {slice_bytes // MIB} MiB = {args.parallel} x {args.cap_mib} MiB caps")
        print(f"jobs:         {args.jobs} x hostrun -m {args.cap_mib}M -- sh -c 'date; sleep {args.sleep}; "
              f"date' ({'one shared label' if args.shared_label else 'one label per job'})")
        print(f"machine:      {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        mode = "private cache (--cached-bytecode)" if args.cached_bytecode else "environment as is"
        print(f"bytecode:     {mode} "
              f"(PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', '')!r})")

        warm = subprocess.run([hostrun, "--config", config, "-m", f"{args.cap_mib}M", "--result-file",
                               os.path.join(tmp, "warm-up.json"), "--", "true"], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True)
        if warm.returncode != 0:
            print(f"hostrun failed in the warm-up (exit {warm.returncode}):\n"
                  f"{warm.stderr.decode('utf-8', 'replace')}", file=sys.stderr)
            return 1

        # -- baseline: no hostrun, a pool of `parallel`
        base_wall, base_codes, base_overlap, base_cpu = run_baseline(
            args.jobs, args.parallel, args.sleep, os.path.join(tmp, "baseline"))
        print(f"\nbaseline (plain Python, pool of {args.parallel}, no hostrun): "
              f"{base_wall:.3f} s = {base_wall / ideal:.2f}x ideal; max at once {base_overlap}; "
              f"exit codes {dict(collections.Counter(base_codes))}; CPU {base_cpu:.2f} s")

        floor_wall, floor_codes, floor_overlap, floor_cpu, floor_first = run_floor(
            interpreter_of(hostrun), args.jobs, args.parallel, args.sleep, os.path.join(tmp, "floor"))
        print(f"floor (bare python3 -I -S clients launched at once, a jobserver of {args.parallel}): "
              f"{floor_wall:.3f} s = {floor_wall / ideal:.2f}x ideal; first job started "
              f"{floor_first * 1000:.0f} ms after launch; max at once {floor_overlap}; "
              f"exit codes {dict(collections.Counter(floor_codes))}; CPU {floor_cpu:.2f} s")

        # -- hostrun: all at once
        outdir = os.path.join(tmp, "hostrun")
        os.makedirs(outdir)
        ts_paths = [os.path.join(outdir, f"job-{i:03d}.ts") for i in range(args.jobs)]
        result_paths = [os.path.join(outdir, f"job-{i:03d}.json") for i in range(args.jobs)]
        log_paths = [os.path.join(outdir, f"job-{i:03d}.log") for i in range(args.jobs)]
        poller = LedgerPoller(os.path.join(state_dir, "ledger.sqlite3"), args.poll_ms / 1000)
        poller.start()
        cpu0 = children_cpu()
        launch_wall = time.time()
        t0 = time.perf_counter()
        launcher = [hostrun]
        phases_path = os.path.join(tmp, "phases.jsonl")
        if args.phases:
            here = os.path.dirname(os.path.abspath(__file__))
            launcher = [interpreter_of(hostrun), os.path.join(here, "_phases.py")]
            env = {**env, "HOSTRUN_BENCH_PHASES": phases_path}
        for i in range(args.jobs):
            argv = [*launcher, "--config", config, "-m", f"{args.cap_mib}M",
                    "--result-file", result_paths[i]]
            argv += ["--label", "bench-sleep" if args.shared_label else f"bench-sleep-{i:03d}"]
            argv += ["--", *job_script(ts_paths[i], args.sleep)]
            with open(log_paths[i], "wb") as log:
                procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT))
        launched = time.perf_counter() - t0
        codes: list[int | None] = []
        deadline = t0 + args.timeout
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.perf_counter())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        wall = time.perf_counter() - t0
        cpu = children_cpu() - cpu0
        poller.stop_event.set()
        poller.join()

        # -- analysis
        intervals, problems = read_intervals(ts_paths)
        overlap = max_overlap(intervals)
        kinds: collections.Counter[str] = collections.Counter()
        booked: collections.Counter[int] = collections.Counter()
        waited: list[float] = []
        for path in result_paths:
            try:
                with open(path, encoding="utf-8") as fh:
                    res = json.load(fh)
            except (OSError, ValueError):
                kinds["(no result file)"] += 1
                continue
            kinds[str(res.get("booking_kind"))] += 1
            booked[int(res.get("booked_bytes") or 0)] += 1
            waited.append(float(res.get("waited_s") or 0.0))
        hung = sum(c is None for c in codes)
        code_summary = collections.Counter("hung" if c is None else c for c in codes)

        print(f"\nhostrun: {args.jobs} jobs launched in {launched * 1000:.0f} ms, "
              f"all exited after {wall:.3f} s")
        ratio = wall / ideal
        wall_ok = ratio <= args.target
        print(f"  wall time:   {wall:.3f} s vs ideal {ideal:.3f} s ({args.jobs}/{args.parallel} x "
              f"{args.sleep} s) = {ratio:.2f}x   target <= {args.target}x -> "
              f"{'PASS' if wall_ok else 'FAIL'}")
        print(f"  vs baseline: {wall / base_wall:.2f}x the no-hostrun wall time ({base_wall:.3f} s); "
              f"{wall / floor_wall:.2f}x the floor's ({floor_wall:.3f} s)")
        if intervals:
            first_start = min(s for s, _ in intervals) - launch_wall
            durations = [e - s for s, e in intervals]
            hand = handoffs(intervals, args.parallel)
            span = max(e for _, e in intervals) - min(s for s, _ in intervals)
            tail = launch_wall + wall - max(e for _, e in intervals)
            print(f"  timeline:    first job started {first_start * 1000:.0f} ms after launch; jobs ran "
                  f"from first start to last end in {span:.3f} s ({span / ideal:.2f}x ideal); last "
                  f"hostrun exited {tail * 1000:.0f} ms after the last job ended")
            use = sum(durations) / (args.parallel * span) if span > 0 else 0.0
            print(f"               job run time (inside its cgroup) median "
                  f"{statistics.median(durations) * 1000:.0f} ms; slot use {use * 100:.0f}% of "
                  f"{args.parallel} slots over that span")
            levels = level_profile(intervals)
            print("               time with k jobs running: " + ", ".join(
                f"{k}: {v:.2f} s" for k, v in levels.items() if v >= 0.0005))
            if hand:
                print(f"               slot hand-off (i-th end -> ({args.parallel}+i)-th start) median "
                      f"{statistics.median(hand) * 1000:.0f} ms, p90 {pct(hand, 90) * 1000:.0f} ms, "
                      f"max {max(hand) * 1000:.0f} ms")
        cores = os.cpu_count() or 1
        print(f"  CPU time:    {cpu:.2f} s user+sys in hostrun processes and their jobs "
              f"({cpu / args.jobs * 1000:.0f} ms per job; {cpu / (wall * cores) * 100:.0f}% of "
              f"{cores} cores over the wall time; baseline {base_cpu:.2f} s)")
        if args.phases:
            print_phases(phases_path, args.jobs)
            print_handoffs(phases_path, ts_paths)
        if waited:
            print(f"  admission wait (result files): median {statistics.median(waited):.3f} s, "
                  f"max {max(waited):.3f} s")
        print(f"  bookings:    kinds {dict(kinds)}; sizes "
              f"{ {f'{b / MIB:.2f} MiB': n for b, n in sorted(booked.items())} }")

        all_zero = code_summary == collections.Counter({0: args.jobs})
        print(f"\n  exit codes:  {dict(code_summary)} -> {'PASS (all 0)' if all_zero else 'FAIL'}")
        print(f"               {' '.join('hung' if c is None else str(c) for c in codes)}")
        if not all_zero:
            for i, c in enumerate(codes):
                if c != 0:
                    with open(log_paths[i], encoding="utf-8", errors="replace") as fh:
                        print(f"    job {i:03d} exit {c}: {fh.read().strip()[-300:]}")
        noisy = [i for i, p in enumerate(log_paths) if os.path.getsize(p) > 0]
        if noisy:
            print(f"  (informational) {len(noisy)} hostrun(s) wrote to stderr; first: "
                  f"{open(log_paths[noisy[0]], encoding='utf-8', errors='replace').read().strip()[:300]}")

        count_target = not args.shared_label
        overlap_ok = overlap <= args.parallel or not count_target
        print("\n  overbooking")
        print(f"    jobs running at once (job timestamps, {len(intervals)} jobs): max {overlap}"
              f"   {'target <= ' + str(args.parallel) if count_target else '(informational)'} -> "
              f"{'PASS' if overlap_ok and not problems else 'FAIL'}")
        for line in problems[:10]:
            print(f"      {line}")
        bytes_ok = poller.max_bytes <= slice_bytes
        count_ok = poller.max_count <= args.parallel or not count_target
        print(f"    ledger poll every {args.poll_ms:g} ms: {poller.samples} samples, {poller.errors} "
              f"errors; max running bookings {poller.max_count}, max booked "
              f"{poller.max_bytes / MIB:.1f} MiB of {slice_bytes / MIB:.0f} MiB; max waiting "
              f"{poller.max_waiting} -> {'PASS' if bytes_ok and count_ok else 'FAIL'}")
        if poller.errors:
            print(f"      first poll error: {poller.first_error}")

        idle_ok = True
        if args.idle_waiters:
            idle_ok = idle_waiting(hostrun, config, env, state_dir, tmp, args.cap_mib * args.parallel,
                                   args.idle_waiters, args.idle_window, args.timeout)
        left = leftovers(state_dir, slice_dir)
        print("\n  leftovers after all jobs ended: " + ("none" if not left else ""))
        for line in left[:20]:
            print(f"    {line}")
        ok = (wall_ok and idle_ok and all_zero and overlap_ok and not problems and bytes_ok and count_ok
              and not left and not hung and poller.samples > 0)
        print(f"\noverall: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        remove_slice(slice_dir)
        if args.keep:
            print(f"(kept {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
