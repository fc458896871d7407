#!/usr/bin/env python3
"""Submit-to-start latency of a job through ``hostrun --peer=CLUSTER`` against plain ``srun``, on a
private one-node Slurm cluster, measured in the same run (issue 12's evidence).

What is measured
----------------
The bench starts its own cluster (``tests/support/slurmcluster.py``: munged, slurmctld, slurmd, all in a
temporary directory, nothing of the machine's own Slurm touched) and a private hostrun config naming
it (``kind = "slurm"``, ``slurm_conf``, its own ``state_dir`` and config cache). The job prints a
wall-clock stamp as its first instruction: ``sh -c 'date +%s.%N'``; ``time.time()`` is taken just
before the command is started (same machine, same clock), so

* submit-to-start = the job's stamp - that time (the target: hostrun <= 1.2x plain srun);
* end to end      = from just before the start to the command's exit (what the user waits).

Series, interleaved (the order rotates every round, so drift hits all), ``--runs`` (default 20) each:

* ``plain srun``: ``srun --mem=256M sh -c 'date +%s.%N'`` with ``SLURM_CONF`` set (the baseline);
* ``hostrun``: ``hostrun --config C --peer=farm -m 256M -- sh -c 'date +%s.%N'``;
* ``srun, hostrun's argv``: for information, the srun command line hostrun built (recorded in the
  warm-up: its flags, the ``sh`` wrapper that reports the step's peak, the job) run by hand, so the
  difference to ``plain srun`` is what Slurm and the wrapper cost, and the rest is hostrun's own.

Where the time goes (printed after the targets):

* PARTS, interleaved: ``python -c pass`` with hostrun's interpreter, ``hostrun --version`` (the
  cheapest hostrun command), the Slurm calls hostrun makes around srun timed alone (``scontrol show
  job -o ID``, read once srun ends; ``squeue --me ... --states=all``, only read when the wrapper's line
  did not come back or on a signal), and the node-side wrapper run here against the bare job.
* CALLS: which Slurm commands one hostrun run starts, recorded by wrappers first on its PATH.
* TIMELINE (``--timeline-runs``, default 10, each side): the same recording wrappers stamp when srun
  starts and ends, splitting each run into: start to srun, srun to the job's first instruction, the
  job to srun's exit, srun's exit to the command's exit; plain srun through the same wrapper, so the
  wrapper's own cost shows on both sides.

hostrun runs this checkout's ``dispatch`` (``PYTHONPATH`` = the repository root) with its bytecode
compiled first (``python -m compileall``, as ``scripts/setup`` leaves an install; ``--no-compile``
skips it, and the header says which applies): with ``PYTHONDONTWRITEBYTECODE=1`` and no ``.pyc``,
every run would compile ``dispatch/*.py`` again, which no installed hostrun does.

At the end the cluster is stopped (also on Ctrl-C or an error) and what it left (step processes,
job cgroups) and any booking left in hostrun's ledger are reported as failures. The exit status is 0
only when the target is met, every run succeeded and nothing was left. Needs root, Slurm and munge
installed, cgroup v1 (``tests.support.slurmcluster.missing_parts`` says what is missing). Standard library
only. Run by hand, e.g.::

    .venv/bin/python bench/bench_slurm.py --runs 20 --json /tmp/slurm-bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from _common import find_hostrun, interpreter_of, ledger_leftovers, pct, ratio_table  # noqa: E402

from tests.support.slurmcluster import ClusterError, SlurmCluster, missing_parts  # noqa: E402

TARGET_RATIO = 1.2
CLUSTER = "farm"
MEM = "256M"
JOB = ["sh", "-c", "date +%s.%N"]
PLAIN = "plain srun"
HOSTRUN = "hostrun"
BY_HAND = "srun, hostrun's argv"
WRAPPED = ("srun", "scontrol", "squeue", "sacct", "scancel", "sinfo")

# A recording wrapper for one Slurm command: stamps its start and end, keeps srun's argv.
RECORDER = """#!/bin/sh
printf 'S {name} %s\\n' "$(date +%s.%N)" >> {log}
{keep}{real} "$@"
rc=$?
printf 'E {name} %s %s\\n' "$(date +%s.%N)" "$rc" >> {log}
exit $rc
"""


class Run:
    """One timed command: exit status, the job's stamp (or None), start times, exit time."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.t0 = time.time()
        p0 = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True)
        self.wall = time.perf_counter() - p0
        self.end = self.t0 + self.wall
        self.rc = done.returncode
        self.stderr = done.stderr.decode("utf-8", "replace")
        try:
            self.stamp: float | None = float(done.stdout.decode().strip())
        except ValueError:
            self.stamp = None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.stamp is not None

    @property
    def latency(self) -> float:
        assert self.stamp is not None
        return self.stamp - self.t0

    def why(self) -> str:
        return f"exit {self.rc}, stamp {self.stamp}: {self.stderr.strip()[-300:]}"


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, int, str]:
    p0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True)
    return time.perf_counter() - p0, done.returncode, done.stderr.decode("utf-8", "replace")


def interleaved(series: dict[str, list[str]], env: dict[str, dict[str, str]], cwd: str, runs: int,
                failures: list[str]) -> dict[str, list[Run]]:
    """``runs`` rounds of every series, the order rotated each round."""
    keys = list(series)
    out: dict[str, list[Run]] = {k: [] for k in keys}
    for i in range(runs):
        k = i % len(keys)
        for key in keys[k:] + keys[:k]:
            run = Run(series[key], env[key], cwd)
            if run.ok:
                out[key].append(run)
            else:
                failures.append(f"{key}, round {i}: {run.why()}")
    return out


def compile_bytecode(python: str, env: dict[str, str]) -> None:
    env = dict(env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(REPO, "dispatch")], env=env,
                   check=True, stdout=subprocess.DEVNULL)


def bytecode_state(python: str, env: dict[str, str]) -> str:
    """Whether dispatch's modules load from cached bytecode in ``env``, in words."""
    probe = ("import importlib.util, os, dispatch.cli.main as m; "
             "print(os.path.exists(importlib.util.cache_from_source(m.__file__)), m.__file__)")
    out = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True).stdout.split()
    if len(out) != 2:
        return "unknown"
    where = os.path.dirname(os.path.dirname(os.path.dirname(out[1])))
    state = "cached" if out[0] == "True" else "NOT cached: dispatch/*.py is compiled on every run"
    return f"{state} (dispatch from {where})"


def write_recorders(tmp: str, cluster_env: dict[str, str]) -> tuple[str, str, str]:
    """Recording wrappers for the Slurm commands; returns (their directory, log, srun argv file)."""
    bindir, log, argv_file = os.path.join(tmp, "rec"), os.path.join(tmp, "calls.log"), \
        os.path.join(tmp, "srun.argv")
    os.makedirs(bindir, mode=0o700)
    for name in WRAPPED:
        real = shutil.which(name, path=cluster_env.get("PATH"))
        if real is None:
            continue
        keep = f"printf '%s\\0' \"$@\" > {argv_file}\n" if name == "srun" else ""
        path = os.path.join(bindir, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(RECORDER.format(name=name, log=log, keep=keep, real=real))
        os.chmod(path, 0o700)
    return bindir, log, argv_file


def read_calls(log: str) -> list[tuple[str, float, float | None]]:
    """(command, start, end or None) of every recorded call, in start order."""
    starts: list[tuple[str, float]] = []
    ends: dict[str, list[float]] = {}
    try:
        with open(log, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if parts[0] == "S":
                    starts.append((parts[1], float(parts[2])))
                elif parts[0] == "E":
                    ends.setdefault(parts[1], []).append(float(parts[2]))
    except OSError:
        return []
    seen: dict[str, int] = {}
    calls: list[tuple[str, float, float | None]] = []
    for name, start in starts:
        n = seen.get(name, 0)
        seen[name] = n + 1
        got = ends.get(name, [])
        calls.append((name, start, got[n] if n < len(got) else None))
    return calls


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def stats_line(label: str, values: list[float], width: int) -> str:
    return (f"  {label:{width}} {statistics.median(values) * 1000:7.1f} {pct(values, 10) * 1000:7.1f} "
            f"{pct(values, 90) * 1000:7.1f}")


def timeline(runs: int, argv: list[str], env: dict[str, str], cwd: str, log: str,
             failures: list[str], label: str) -> dict[str, list[float]]:
    """Per run: start to srun, srun to the job's stamp, the stamp to srun's end, srun's end to exit,
    and the time in scontrol/squeue calls after srun."""
    cols: dict[str, list[float]] = {k: [] for k in ("to srun", "srun to job", "job to srun end",
                                                    "srun end to exit", "slurm calls after")}
    for i in range(runs):
        if os.path.exists(log):
            os.unlink(log)
        run = Run(argv, env, cwd)
        calls = read_calls(log)
        srun = [c for c in calls if c[0] == "srun"]
        if not run.ok or len(srun) != 1 or srun[0][2] is None or run.stamp is None:
            failures.append(f"timeline {label}, run {i}: {run.why()} calls {calls}")
            continue
        _, s_start, s_end = srun[0]
        assert s_end is not None
        cols["to srun"].append(s_start - run.t0)
        cols["srun to job"].append(run.stamp - s_start)
        cols["job to srun end"].append(s_end - run.stamp)
        cols["srun end to exit"].append(run.end - s_end)
        cols["slurm calls after"].append(sum((e or s) - s for n, s, e in calls if n != "srun" and s >= s_end))
    return cols


def import_profile(python: str, argv: list[str], env: dict[str, str], cwd: str, top: int,
                   repeat: int = 3) -> dict[str, float]:
    """``-X importtime`` of a hostrun run (median of ``repeat`` by total): totals and the top modules
    by cumulative time, printed; returns the totals in seconds."""
    runs = []
    for _ in range(repeat):
        done = subprocess.run([python, "-X", "importtime", *argv], env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL, capture_output=True)
        rows = []
        for line in done.stderr.decode("utf-8", "replace").splitlines():
            if line.startswith("import time:"):
                parts = line[len("import time:"):].split("|")
                if parts[0].strip().isdigit():
                    rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
        runs.append((sum(r[0] for r in rows), rows))
    runs.sort(key=lambda r: r[0])
    total, rows = runs[len(runs) // 2]
    ours = sum(r[0] for r in rows if r[2].strip().split(".")[0] == "dispatch")
    print(f"\nIMPORTS of one hostrun run (-X importtime, median of {repeat} by total): {len(rows)} modules, "
          f"{total / 1000:.1f} ms in all, dispatch.* own {ours / 1000:.1f} ms; top {top} by cumulative:")
    for self_us, cum_us, name in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"  {cum_us / 1000:7.1f} ms {self_us / 1000:7.1f} ms self  {name}")
    return {"imports_s": total / 1e6, "dispatch_self_s": ours / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="measured runs of each series (>= 10; default 20)")
    ap.add_argument("--timeline-runs", type=int, default=10,
                    help="runs of each side for the timeline (0 skips it; default 10)")
    ap.add_argument("--hostrun", metavar="PATH",
                    help="hostrun executable (default: <dir of sys.executable>/hostrun)")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not byte-compile dispatch/ first (the header says whether .pyc exist)")
    ap.add_argument("--top", type=int, default=12, help="import-time entries to show (default 12)")
    ap.add_argument("--json", metavar="PATH", help="also write every measurement and the summary here")
    args = ap.parse_args()
    if args.runs < 10:
        ap.error("--runs must be at least 10 (medians and p90 of >= 10 runs)")
    why = missing_parts()
    if why:
        print(f"bench: cannot start a private Slurm cluster: {why}", file=sys.stderr)
        return 1

    hostrun = find_hostrun(args.hostrun)
    python = interpreter_of(hostrun)
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-slurm-")
    os.chmod(tmp, 0o700)
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp")))  # munge: short path
    failures: list[str] = []
    left: list[str] = []
    verdict = "FAIL"
    try:
        env_h = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        env_h.pop("HOSTRUN_CONFIG", None)
        env_h["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env_h.get("PYTHONPATH")) if p)
        if not args.no_compile:
            compile_bytecode(python, env_h)
        try:
            cluster.start()
        except ClusterError as exc:
            print(f"bench: the private Slurm cluster did not start: {exc}", file=sys.stderr)
            return 1
        env_s = dict(cluster.env)
        state_dir = os.path.join(tmp, "state")
        config = os.path.join(tmp, "hosts.toml")
        with open(config, "w", encoding="utf-8") as fh:
            fh.write(f"enable_across_machines = true\nstate_dir = '{state_dir}'\n\n[hosts.{CLUSTER}]\n"
                     f"kind = 'slurm'\nslurm_conf = '{cluster.conf}'\n")
        work = os.path.join(tmp, "work")  # the jobs' working directory (hostrun passes it as --chdir)
        os.mkdir(work)
        version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip()
        srun_version = cluster.run(["srun", "--version"]).stdout.strip()
        print(f"hostrun:      {hostrun} (PYTHONPATH={REPO})")
        print(f"interpreter:  {python} (Python {version})")
        print(f"bytecode:     {bytecode_state(python, env_h)}"
              f"{'' if args.no_compile else '; compiled first (python -m compileall dispatch)'}")
        print(f"cluster:      {srun_version}, one node ({cluster.node}), up in {ms(cluster.started_in)}; "
              f"SLURM_CONF={cluster.conf}")
        print(f"config:       {config} (host {CLUSTER!r}, kind slurm; state_dir {state_dir})")
        print(f"machine:      {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        print(f"job:          {' '.join(JOB[:2])} '{JOB[2]}' (its stamp - time.time() before the start)")

        cmd_plain = ["srun", f"--mem={MEM}", *JOB]
        cmd_hostrun = [hostrun, "--config", config, f"--peer={CLUSTER}", "-m", MEM, "--", *JOB]
        bindir, log, argv_file = write_recorders(tmp, env_s)
        env_rec = dict(env_h, PATH=f"{bindir}{os.pathsep}{env_h.get('PATH', '')}")

        # Warm-up (not timed): validate and cache the config; record one run's Slurm calls and argv.
        for label, argv, env in (("hostrun", cmd_hostrun, env_h), ("hostrun, recorded", cmd_hostrun, env_rec),
                                 ("plain srun", cmd_plain, env_s)):
            if os.path.exists(log):
                os.unlink(log)
            run = Run(argv, env, work)
            print(f"warm-up {label}: {ms(run.wall)}, exit {run.rc}")
            if not run.ok:
                print(f"bench: warm-up {label} failed: {run.why()}", file=sys.stderr)
                return 1
            if label == "hostrun, recorded":
                calls = read_calls(log)
        with open(argv_file, "rb") as fh:
            cmd_by_hand = ["srun", *(a.decode() for a in fh.read().split(b"\0")[:-1])]
        print("\nCALLS: the Slurm commands one hostrun run started (recording wrappers on its PATH):")
        t_first = calls[0][1] if calls else 0.0
        for name, start, end in calls:
            took = f"{(end - start) * 1000:6.1f} ms" if end is not None else "  (no end)"
            print(f"  +{(start - t_first) * 1000:7.1f} ms  {name:9} {took}")
        print("  srun argv: " + " ".join(a if "\n" not in a else "<wrapper script>" for a in cmd_by_hand))
        job_id = next((line.split("=", 1)[1].split()[0] for line in cluster.run(
            ["squeue", "-h", "-t", "all", "-o", "JobId=%i", "--sort=-i"]).stdout.split()[:1]), "1")

        # --- the targets -----------------------------------------------------------------------
        series = {PLAIN: cmd_plain, HOSTRUN: cmd_hostrun, BY_HAND: cmd_by_hand}
        envs = {PLAIN: env_s, HOSTRUN: env_h, BY_HAND: env_s}
        results = interleaved(series, envs, work, args.runs, failures)
        if any(len(v) < 2 for v in results.values()):
            print("bench: too many failed runs to compute anything:", *failures[:5], sep="\n  ",
                  file=sys.stderr)
            return 1
        lat = {k: [r.latency for r in v] for k, v in results.items()}
        e2e = {k: [r.wall for r in v] for k, v in results.items()}
        labels = [PLAIN, HOSTRUN, BY_HAND]
        print(f"\nSUBMIT TO START ({args.runs} runs each, interleaved; ms; ratio to plain srun's median)")
        ratio_table(lat, labels, 22, base_label=PLAIN)
        print("\nEND TO END (same runs; ms)")
        ratio_table(e2e, labels, 22, base_label=PLAIN)
        med_l = {k: statistics.median(v) for k, v in lat.items()}
        med_e = {k: statistics.median(v) for k, v in e2e.items()}
        ratio = med_l[HOSTRUN] / med_l[PLAIN]
        verdict = "PASS" if ratio <= TARGET_RATIO and not failures else "FAIL"
        print(f"\n  submit-to-start: hostrun {ms(med_l[HOSTRUN])} vs plain srun {ms(med_l[PLAIN])}: "
              f"{ratio:.2f}x, {(med_l[HOSTRUN] - med_l[PLAIN]) * 1000:+.1f} ms "
              f"(p90 {pct(lat[HOSTRUN], 90) * 1000:.1f} vs {pct(lat[PLAIN], 90) * 1000:.1f} ms)")
        print(f"  end to end:      hostrun {ms(med_e[HOSTRUN])} vs plain srun {ms(med_e[PLAIN])}: "
              f"{med_e[HOSTRUN] / med_e[PLAIN]:.2f}x, {(med_e[HOSTRUN] - med_e[PLAIN]) * 1000:+.1f} ms")
        print(f"  of which Slurm + the wrapper (hostrun's srun argv by hand - plain srun): submit-to-start "
              f"{(med_l[BY_HAND] - med_l[PLAIN]) * 1000:+.1f} ms, end to end "
              f"{(med_e[BY_HAND] - med_e[PLAIN]) * 1000:+.1f} ms")
        print(f"  target: submit-to-start <= {TARGET_RATIO}x plain srun  -> {verdict} ({ratio:.2f}x)")
        if failures:
            print(f"  {len(failures)} run(s) failed (the target fails with them):")
            for line in failures[:10]:
                print(f"    {line}")

        # --- where the time goes ---------------------------------------------------------------
        wrapper_argv = next((cmd_by_hand[i + 1:] for i, a in enumerate(cmd_by_hand) if a == "sh"
                             and cmd_by_hand[i + 1:i + 2] == ["-c"]), [])
        parts = {
            "python -c pass": ([python, "-c", "pass"], env_h),
            "hostrun --version": ([hostrun, "--version"], env_h),
            f"scontrol show job -o {job_id}": (["scontrol", "show", "job", "-o", job_id], env_s),
            "squeue --me --states=all": (["squeue", "--me", "--noheader", "--states=all",
                                          "--format=%i|%k"], env_s),
            "sh -c 'date' here": (JOB, env_s),
            "the wrapper + job here": (["sh", *wrapper_argv], env_s),
        }
        ptimes: dict[str, list[float]] = {k: [] for k in parts}
        keys = list(parts)
        for i in range(args.runs):
            k = i % len(keys)
            for key in keys[k:] + keys[:k]:
                wall, rc, err = timed(parts[key][0], parts[key][1], work)
                if rc != 0:
                    failures.append(f"part {key}: exit {rc}: {err.strip()[:200]}")
                ptimes[key].append(wall)
        print(f"\nPARTS ({args.runs} runs each, interleaved; ms; ratio to python -c pass)")
        ratio_table(ptimes, keys, 30)

        tl: dict[str, dict[str, list[float]]] = {}
        if args.timeline_runs > 0:
            plain_rec = [os.path.join(bindir, "srun"), *cmd_plain[1:]]
            for _ in range(args.timeline_runs):  # alternate the two sides
                for label, argv, env in ((HOSTRUN, cmd_hostrun, env_rec), (PLAIN, plain_rec, env_s)):
                    got = timeline(1, argv, env, work, log, failures, label)
                    for col, values in got.items():
                        tl.setdefault(label, {}).setdefault(col, []).extend(values)
            cols = list(next(iter(tl.values())))
            print(f"\nTIMELINE ({args.timeline_runs} runs each, alternated, srun through a recording sh "
                  f"wrapper on both sides; medians, ms)")
            print(f"  {'':12}" + "".join(f" {c:>17}" for c in cols))
            for label in (HOSTRUN, PLAIN):
                row = tl.get(label, {})
                print(f"  {label:12}" + "".join(
                    f" {statistics.median(row[c]) * 1000 if row.get(c) else float('nan'):17.1f}"
                    for c in cols))
        imports = import_profile(python, cmd_hostrun, env_h, work, args.top)
        if failures and verdict == "PASS":
            verdict = "FAIL"

        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump({"runs": args.runs, "target_ratio": TARGET_RATIO, "ratio": ratio,
                           "verdict": verdict, "srun_argv": cmd_by_hand,
                           "calls": [[n, s - t_first, None if e is None else e - s] for n, s, e in calls],
                           "submit_to_start_s": lat, "end_to_end_s": e2e, "parts_s": ptimes,
                           "timeline_s": tl, "imports": imports, "failures": failures}, fh, indent=1)
            print(f"\nmeasurements written to {args.json}")
        left = ledger_leftovers(state_dir, CLUSTER)
    except KeyboardInterrupt:
        print("\nbench: interrupted", file=sys.stderr)
        verdict = "FAIL"
    finally:
        left += cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        print("\nleftovers (cluster stopped; step processes, job cgroups, ledger bookings): "
              + ("none" if not left else ""))
        for line in left:
            print(f"  {line}")
    return 0 if verdict == "PASS" and not left else 1


if __name__ == "__main__":
    sys.exit(main())
