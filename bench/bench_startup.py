#!/usr/bin/env python3
"""Startup cost of ``hostrun -- true`` against a bare Python start, measured in the same run.

What is measured
----------------
* ``hostrun --config PRIVATE -- true``: the whole path of a real job on this host (config from the
  cache, ledger booking and release, slice/job cgroup, running ``true``, recording its peak).
* the baseline: ``PYTHON -c pass`` with the SAME interpreter hostrun runs on (the venv's
  ``sys.executable``, i.e. the ``#!`` of the ``hostrun`` script), so the ratio shows hostrun's own cost
  and not the difference between two Pythons.

The two are interleaved (A B, B A, A B, ...), so both see the same machine noise. One warm-up run of
hostrun comes first and is not counted: it validates the config with pydantic and writes the cached,
normalized form that every later run reads.

* the same ``hostrun -- true`` with the opposite answer to "does this host have NVIDIA GPUs?": on a
  host without GPUs, a fake ``/proc/driver/nvidia/gpus`` with one entry (``HOSTRUN_NVIDIA_PROC``, the
  test hook), so every job imports ``dispatch.local.gpus.kernlog`` and watches the real ``/dev/kmsg``; on a
  host with GPUs, an empty one. It runs with dispatch's bytecode cached, as the ``[*]`` series, and its
  difference to that series is what the kernel-log watch costs per job on a GPU host
  (``--no-gpu-series`` skips it).

Reported: median, p10 and p90 wall time of each, the ratio of the medians and the target
(``hostrun -- true`` <= 2.5x bare ``python -c pass``); the same for CPU time (user+sys from ``wait4``,
with the children each process waited for: a hostrun's guardian and job), which other sessions' load
moves far less than wall time; then the
top entries of ``python -X importtime -m dispatch -- true`` by cumulative import time, and whether
``dispatch.local.gpus.kernlog`` and ``dispatch.local.gpus.gpu`` were imported (neither without GPUs).

Isolation: a private temporary config (own ``state_dir``, own slice cgroup
``<this process's memory cgroup>/hostrun-bench-<pid>``, own ``XDG_CACHE_HOME`` for the config cache),
passed with ``--config``, so nobody's ledger is touched. Everything is removed in a ``finally`` block;
anything hostrun leaves behind (job cgroups, bookings) is reported before it is cleaned up.

Needs: root and a cgroup v1 memory controller (as on the reference machines), or whatever backend
hostrun picks here. Standard library only. Run by hand, e.g.::

    .venv/bin/python bench/bench_startup.py --runs 30
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _common import (
    find_hostrun,
    interpreter_of,
    leftovers,
    private_env,
    remove_slice,
    startup_hooks,
    write_config,
)

TARGET_RATIO = 2.5  # issue 13 item 4 (was 3.0)
STRACE_RUNS = 5
MEMORY_MOUNT = "/sys/fs/cgroup/memory"


# ---------------------------------------------------------------- shared setup helpers














def _lists_any(path: str) -> bool:
    try:
        return bool(os.listdir(path))
    except OSError:
        return False


def pct(values: list[float], q: int) -> float:
    """q-th percentile (inclusive method), q in 1..99."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# ---------------------------------------------------------------- the benchmark
def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, str, float]:
    """Wall time, exit code, stderr and CPU time (user+sys of the process and every child it waited
    for: the guardian and the job of a ``hostrun``), read from ``wait4``'s resource usage."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    return wall, proc.returncode, text, usage.ru_utime + usage.ru_stime


def bytecode_state(python: str, env: dict[str, str]) -> str:
    """Whether dispatch's modules load from cached bytecode in ``env``, in words."""
    probe = ("import importlib.util, os, sys, dispatch.cli.main as m; "
             "c = importlib.util.cache_from_source(m.__file__); "
             "print(os.path.exists(c), sys.dont_write_bytecode, sys.pycache_prefix or '-', c)")
    out = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True).stdout.split()
    if len(out) != 4:
        return "unknown"
    exists, dont_write, _prefix, path = out
    if exists == "True":
        return f"cached ({path})"
    why = "PYTHONDONTWRITEBYTECODE is set" if dont_write == "True" else "not written yet"
    return f"NOT cached ({why}): dispatch/*.py is compiled on every run"


def syscall_counts(commands: list[tuple[str, list[str]]], env: dict[str, str], tmp: str) -> None:
    """The system calls each command makes (``strace -f -c``, all threads and children), median of
    STRACE_RUNS runs: what start-up costs the kernel, apart from the wall-time noise."""
    if shutil.which("strace") is None:
        print("\nsyscalls: strace not installed, skipped")
        return
    print(f"\nsyscalls (strace -f -c, median of {STRACE_RUNS} runs):")
    counts = {}
    for label, argv in commands:
        totals = []
        for i in range(STRACE_RUNS):
            out = os.path.join(tmp, f"strace-{i}.txt")
            subprocess.run(["strace", "-f", "-c", "-o", out, *argv], env=env, capture_output=True,
                           check=False)
            with open(out, encoding="utf-8") as fh:
                total = [line.split() for line in fh if line.rstrip().endswith("total")]
            totals.append(int(total[-1][3]) if total and len(total[-1]) > 4 else 0)  # "% s us/call calls"
        counts[label] = statistics.median(totals)
        print(f"  {label:36} {counts[label]:8.0f}")
    first, base = commands[0][0], commands[-1][0]
    if counts.get(base):
        print(f"  ratio {first} / {base}: {counts[first] / counts[base]:.2f}x")


def importtime_profile(python: str, config: str, env: dict[str, str], top: int,
                       title: str, repeat: int = 5) -> None:
    """One ``-X importtime`` run is noisy: run it ``repeat`` times and show the median run."""
    argv = [python, "-X", "importtime", "-m", "dispatch", "--config", config, "--", "true"]
    runs = []
    for _ in range(repeat):
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        rows: list[tuple[int, int, str]] = []
        other: list[str] = []
        for line in proc.stderr.decode("utf-8", "replace").splitlines():
            if not line.startswith("import time:"):
                other.append(line)
                continue
            parts = line[len("import time:"):].split("|")
            try:
                rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
            except (ValueError, IndexError):
                continue  # the header line
        runs.append((sum(r[0] for r in rows), proc.returncode, rows, other))
    runs.sort(key=lambda r: r[0])
    _, returncode, rows, other = runs[len(runs) // 2]
    print(f"\nImport-time profile, {title} (median of {repeat} runs by total):")
    print(f"  {os.path.basename(python)} -X importtime -m dispatch --config PRIVATE -- true"
          f"  (exit {returncode})")
    if not rows:
        print("  (no importtime output)")
        return
    # loaded on a GPU host / for --gpu-memory
    for module in ("dispatch.local.gpus.kernlog", "dispatch.local.gpus.gpu"):
        found = [r for r in rows if r[2].strip() == module]
        print(f"  {module} imported: " + (f"yes, {found[0][1] / 1000:.1f} ms cumulative" if found else "no"))
    total_self = sum(r[0] for r in rows)
    ours = sum(r[0] for r in rows if r[2].strip().split(".")[0] == "dispatch")
    print(f"  {len(rows)} modules imported, {total_self / 1000:.1f} ms in all "
          f"(dispatch.* modules' own time: {ours / 1000:.1f} ms)")
    if top <= 0:
        return
    print(f"  top {top} by cumulative time:")
    print(f"  {'cumul ms':>9} {'self ms':>8}  module")
    for self_us, cum_us, name in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"  {cum_us / 1000:9.1f} {self_us / 1000:8.1f}  {name}")
    if other:
        print("  stderr besides importtime:")
        for line in other[:10]:
            print(f"    {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30, help="measured runs of each (>= 20; default 30)")
    ap.add_argument("--hostrun", metavar="PATH",
                    help="hostrun executable (default: <dir of sys.executable>/hostrun)")
    ap.add_argument("--top", type=int, default=15, help="import-time entries to show (default 15)")
    ap.add_argument("--slice", default="500M", help="slice size of the private config (default 500M)")
    ap.add_argument("--no-cached-series", action="store_true",
                    help="skip the extra series with a private bytecode cache (PYTHONPYCACHEPREFIX)")
    ap.add_argument("--no-gpu-series", action="store_true",
                    help="skip the extra series with the opposite GPU answer (HOSTRUN_NVIDIA_PROC)")
    args = ap.parse_args()
    if args.runs < 20:
        ap.error("--runs must be at least 20 (medians of >= 20 runs)")

    hostrun = find_hostrun(args.hostrun)
    python = interpreter_of(hostrun)
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-startup-")
    slice_dir: str | None = None
    try:
        config, slice_dir = write_config(tmp, args.slice)
        env = private_env(tmp)
        # The same, but with bytecode written to (and read from) a private cache: shows what
        # hostrun costs where its .pyc files exist (a normal pip install, a normal shell).
        env_cached = dict(env, PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        env_cached.pop("PYTHONDONTWRITEBYTECODE", None)
        # The other answer to "NVIDIA GPUs here?" (dispatch.core.hostfacts.has_nvidia_gpus, read per job).
        has_gpus = _lists_any(env.get("HOSTRUN_NVIDIA_PROC") or "/proc/driver/nvidia/gpus")
        fake_proc = os.path.join(tmp, "nvidia-gpus")
        os.makedirs(os.path.join(fake_proc, "0000:00:00.0") if not has_gpus else fake_proc)
        env_flip = dict(env if args.no_cached_series else env_cached, HOSTRUN_NVIDIA_PROC=fake_proc)
        version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip()
        print(f"hostrun:      {hostrun}")
        print(f"interpreter:  {python} (Python {version}; hostrun's own, used for the baseline)")
        print(f"config:       {config} (state_dir {tmp}/state, slice {args.slice})")
        print(f"slice cgroup: {slice_dir or '(hostrun default)'}")
        print(f"machine:      {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        print(f"NVIDIA GPUs:  {'yes' if has_gpus else 'no'} (/proc/driver/nvidia/gpus); kernel log: "
              f"{env.get('HOSTRUN_KERNEL_LOG') or '/dev/kmsg'}")
        print(f"start hooks:  {startup_hooks(python)}")
        print(f"environment:  PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; "
              f"dispatch bytecode: {bytecode_state(python, env)}")

        cmd_hostrun = [hostrun, "--config", config, "--", "true"]
        cmd_python = [python, "-c", "pass"]

        wall, rc, err, _ = timed(cmd_hostrun, env)
        print(f"\nwarm-up (validates and caches the config): {wall * 1000:.1f} ms, exit {rc}")
        if rc != 0:
            print(f"hostrun failed in the warm-up:\n{err}", file=sys.stderr)
            return 1
        series = [("hostrun", "hostrun -- true", cmd_hostrun, env),
                  ("python", "python -c pass (same python)", cmd_python, env)]
        if not args.no_cached_series:
            for argv in (cmd_hostrun, cmd_hostrun, cmd_python):  # fill the private bytecode cache
                timed(argv, env_cached)
            series.insert(1, ("cached", "hostrun -- true, .pyc cached [*]", cmd_hostrun, env_cached))
        flip_label = ("hostrun -- true, no GPU [fake, empty]" if has_gpus
                      else "hostrun -- true, GPU host [fake]")
        flip_label += "" if args.no_cached_series else " [*]"
        same = "hostrun" if args.no_cached_series else "cached"  # the same bytecode state
        if not args.no_gpu_series:
            timed(cmd_hostrun, env_flip)  # not counted, as the warm-up
            series.insert(1, ("flip", flip_label, cmd_hostrun, env_flip))

        times: dict[str, list[float]] = {key: [] for key, _, _, _ in series}
        cpus: dict[str, list[float]] = {key: [] for key, _, _, _ in series}
        failures: list[str] = []
        for i in range(args.runs):
            k = i % len(series)
            for key, _, argv, run_env in series[k:] + series[:k]:  # rotate: share the noise
                wall, rc, err, cpu = timed(argv, run_env)
                times[key].append(wall)
                cpus[key].append(cpu)
                if rc != 0:
                    failures.append(f"run {i} {key}: exit {rc}: {err.strip()[:200]}")

        print(f"\n{args.runs} runs each, interleaved; wall time in ms")
        print(f"  {'':36} {'median':>8} {'p10':>8} {'p90':>8} {'min':>8} {'max':>8}")
        med = {}
        for key, label, _, _ in series:
            v = times[key]
            med[key] = statistics.median(v)
            print(f"  {label:36} {med[key] * 1000:8.1f} {pct(v, 10) * 1000:8.1f} "
                  f"{pct(v, 90) * 1000:8.1f} {min(v) * 1000:8.1f} {max(v) * 1000:8.1f}")
        print("\n  CPU time (user+sys, with the children each waited for), ms")
        print(f"  {'':36} {'median':>8} {'p10':>8} {'p90':>8} {'ratio':>8}")
        cpu_med = {key: statistics.median(cpus[key]) for key in cpus}
        for key, label, _, _ in series:
            v = cpus[key]
            print(f"  {label:36} {cpu_med[key] * 1000:8.1f} {pct(v, 10) * 1000:8.1f} "
                  f"{pct(v, 90) * 1000:8.1f} {cpu_med[key] / cpu_med['python']:7.2f}x")
        print(f"  hostrun's own CPU: {(cpu_med['hostrun'] - cpu_med['python']) * 1000:.1f} ms"
              + (f"; with .pyc cached [*] {(cpu_med['cached'] - cpu_med['python']) * 1000:.1f} ms"
                 if "cached" in cpu_med else ""))
        ratio = med["hostrun"] / med["python"]
        verdict = "PASS" if ratio <= TARGET_RATIO and not failures else "FAIL"
        print(f"\n  ratio of medians, hostrun -- true / python -c pass: {ratio:.2f}x "
              f"(hostrun's own cost {(med['hostrun'] - med['python']) * 1000:.1f} ms)")
        print(f"  target: <= {TARGET_RATIO:g}x  -> {verdict}")
        if "cached" in med:
            print(f"  [*] with dispatch's bytecode cached (private PYTHONPYCACHEPREFIX, "
                  f"PYTHONDONTWRITEBYTECODE unset): {med['cached'] / med['python']:.2f}x "
                  f"({(med['cached'] - med['python']) * 1000:.1f} ms over python) -> "
                  f"{'within' if med['cached'] / med['python'] <= TARGET_RATIO else 'over'} target")
        if "flip" in med:
            gpu_med, plain_med = (med[same], med["flip"]) if has_gpus else (med["flip"], med[same])
            print(f"  {flip_label}: {med['flip'] / med['python']:.2f}x python -c pass; the kernel-log "
                  f"watch of a host with GPUs costs {(gpu_med - plain_med) * 1000:+.1f} ms per job "
                  f"({gpu_med / plain_med:.2f}x the same job without GPUs)")
        if failures:
            print(f"  {len(failures)} run(s) exited non-zero:")
            for line in failures[:10]:
                print(f"    {line}")
            verdict = "FAIL"

        syscall_counts([("hostrun -- true", cmd_hostrun), ("python -c pass", cmd_python)],
                       env if args.no_cached_series else env_cached, tmp)
        importtime_profile(python, config, env, args.top, "environment as is")
        if not args.no_cached_series:
            importtime_profile(python, config, env_cached, args.top, "bytecode cached [*]")
        if not args.no_gpu_series:
            importtime_profile(python, config, env_flip, 0, flip_label)

        left = leftovers(os.path.join(tmp, "state"), slice_dir)
        print("\nleftovers after all runs: " + ("none" if not left else ""))
        for line in left:
            print(f"  {line}")
        return 0 if verdict == "PASS" and not left else 1
    finally:
        remove_slice(slice_dir)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
