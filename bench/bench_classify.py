"""Benchmark: the cost of classifying a shell command (dispatch.hooks.classify), which a coding
agent's hook runs before every shell command.

Full process time of ``python -c "from dispatch.hooks.classify import classify; classify(CMD, '.')"``
on light commands against bare ``python -c pass`` with the same interpreter, interleaved (target:
ratio of medians <= 2x), a few other commands for information (a heavy one, one that reads a script,
one through hostrun), the same with dispatch's bytecode cached, the in-process time per call, and
the import-time profile. No root needed. Run by hand, e.g.::

    .venv/bin/python bench/bench_classify.py --runs 30
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

from _common import ratio_table

TARGET_RATIO = 2.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LIGHT = ("git status", "cd src && ls -la | wc -l", "cargo --version", "rg -n TODO src/ | head -20")
OTHER = ("cargo test --workspace 2>&1 | tail -5", "./scripts/all-tests",
         "hostrun -m 4G -- cargo test")
INPROCESS = LIGHT + OTHER + ("bash -c 'cd x && FOO=1 timeout 600 nice make -j8'",)


def _code(command: str) -> str:
    return f"from dispatch.hooks.classify import classify; classify({command!r}, '.')"


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    return time.perf_counter() - t0, proc.returncode, proc.stderr.decode("utf-8", "replace")


def make_project(tmp: str) -> str:
    """A small project: ``src/``, and ``scripts/all-tests`` (~60 lines, heavy on its last)."""
    project = os.path.join(tmp, "project")
    os.makedirs(os.path.join(project, "src"))
    os.makedirs(os.path.join(project, "scripts"))
    with open(os.path.join(project, "scripts", "all-tests"), "w", encoding="utf-8") as fh:
        fh.write("#!/bin/bash\nset -euo pipefail\n")
        for k in range(28):
            fh.write(f'echo "step {k}"\nif [ -d "crate{k}" ]; then ls "crate{k}" | wc -l; fi\n')
        fh.write("cargo test --workspace --all-features\n")
    os.chmod(os.path.join(project, "scripts", "all-tests"), 0o755)
    return project


def in_process(runs: int, cwd: str) -> list[tuple[str, float]]:
    """Microseconds per ``classify`` call, per command (best of 5 rounds of ``runs`` calls)."""
    sys.path.insert(0, ROOT)
    from dispatch.hooks.classify import classify

    out = []
    for command in INPROCESS:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(runs):
                classify(command, cwd, env={})
            best = min(best, (time.perf_counter() - t0) / runs)
        out.append((command, best * 1e6))
    return out


def import_profile(python: str, env: dict[str, str], cwd: str) -> tuple[float, list[str]]:
    """The modules the light classify imports beyond ``python -c pass``, and their own import time
    (ms; ``-X importtime`` self times, the median of 5 runs)."""
    names: list[set[str]] = []
    for code in (_code(LIGHT[0]), "pass"):
        argv = [python, "-X", "importtime", "-c", code]
        err = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True).stderr
        rows = [line[len("import time:"):].split("|") for line in err.splitlines()
                if line.startswith("import time:") and "self [us]" not in line]
        names.append({r[2].strip() for r in rows})
    extra = names[0] - names[1]
    totals = []
    for _ in range(5):
        err = subprocess.run([python, "-X", "importtime", "-c", _code(LIGHT[0])], env=env, cwd=cwd,
                             capture_output=True, text=True).stderr
        rows = [line[len("import time:"):].split("|") for line in err.splitlines()
                if line.startswith("import time:") and "self [us]" not in line]
        totals.append(sum(int(r[0]) for r in rows if r[2].strip() in extra))
    return statistics.median(totals) / 1000, sorted(extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="measured runs of each series (>= 20)")
    ap.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    ap.add_argument("--calls", type=int, default=2000, help="in-process calls per round (default 2000)")
    args = ap.parse_args()
    if args.runs < 20:
        ap.error("--runs must be at least 20 (medians of >= 20 runs)")
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-classify-")
    try:
        project = make_project(tmp)
        env = dict(os.environ, PYTHONPATH=ROOT)
        env_cached = dict(env, PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        env_cached.pop("PYTHONDONTWRITEBYTECODE", None)
        python = args.python
        print(f"interpreter: {python}; dispatch from {ROOT}")
        print(f"machine:     {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
              f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
        series: list[tuple[str, list[str], dict[str, str]]] = [
            ("python -c pass", [python, "-c", "pass"], env)]
        series += [(f"light: {c}", [python, "-c", _code(c)], env) for c in LIGHT]
        series += [(f"other: {c}", [python, "-c", _code(c)], env) for c in OTHER]
        series += [(f"light [*]: {LIGHT[0]}", [python, "-c", _code(LIGHT[0])], env_cached)]
        for _, argv, run_env in series:  # warm-up, fills the private bytecode cache
            _, rc, err = timed(argv, run_env, project)
            if rc != 0:
                print(f"failed: {' '.join(argv)}\n{err}", file=sys.stderr)
                return 1
        times: dict[str, list[float]] = {label: [] for label, _, _ in series}
        for i in range(args.runs):
            k = i % len(series)
            for label, argv, run_env in series[k:] + series[:k]:  # rotate: share the noise
                times[label].append(timed(argv, run_env, project)[0])
        print(f"\n{args.runs} runs each, interleaved; wall time in ms (cwd: a small project)")
        base = ratio_table(times, [label for label, _, _ in series], 52)
        light_all = [t for c in LIGHT for t in times[f"light: {c}"]]
        ratio = statistics.median(light_all) / base
        verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
        print(f"\n  light commands (all {len(LIGHT)} pooled) / python -c pass: {ratio:.2f}x "
              f"(+{(statistics.median(light_all) - base) * 1000:.1f} ms); target <= {TARGET_RATIO:.0f}x "
              f"-> {verdict}")
        cached = statistics.median(times[f"light [*]: {LIGHT[0]}"]) / base
        print(f"  [*] with dispatch's bytecode cached (private PYTHONPYCACHEPREFIX): {cached:.2f}x")

        print(f"\nIn process, per classify() call (best of 5 rounds of {args.calls} calls):")
        for command, micros in in_process(args.calls, project):
            print(f"  {micros:8.1f} us  {command}")
        extra_ms, modules = import_profile(python, env_cached, project)
        print(f"\nImports beyond python -c pass (bytecode cached): {extra_ms:.1f} ms, "
              f"{len(modules)} modules: {' '.join(modules)}")
        return 0 if verdict == "PASS" else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
