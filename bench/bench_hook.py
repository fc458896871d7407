"""Benchmark: the full process time of ``hostrun hook pre-tool-use`` (Claude Code's PreToolUse hook,
dispatch.hooks.claude), which runs before every shell command of an agent, and of ``hostrun hook
post-tool-use``, which runs after every tool call.

Series, interleaved (rotating order): bare ``python -c pass`` with the same interpreter (baseline);
the hook fed a recorded-shape event for four light commands, and PostToolUse with no unread alert
(its usual case: the session's alert cursor read, nothing to say) (target for each: pooled median
<= 2x the baseline; no answer, and neither loads pydantic, rich or sqlite); and, for
information, a heavy command in ``remind`` mode, which reads this host's report for the resource table
(local only: the private config has no peer). The hook runs as ``hostrun agents install`` writes it:
the absolute path of the ``hostrun`` console script (here a copy of the script pip writes, run by the
chosen interpreter with dispatch from this tree); ``python -m dispatch`` (``runpy``, ~7 ms more) is
timed beside it for information. A private config, state dir, config cache and slice cgroup, as the
other benchmarks (bench/README.md, "Isolation"). Run by hand, e.g.::

    .venv/bin/python bench/bench_hook.py --runs 30
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

from _common import leftovers, private_env, ratio_table, remove_slice, write_config

TARGET_RATIO = 2.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIGHT = ("git status", "cd src && ls -la | wc -l", "cargo --version", "rg -n TODO src/ | head -20")
HEAVY = "cargo test --workspace 2>&1 | tail -20"
HEAVY_MODULES = ("pydantic", "rich", "sqlite3")
POST = "post-tool-use, nothing unread"


def event(command: str, cwd: str, name: str = "PreToolUse") -> bytes:
    data = {"session_id": "bench", "transcript_path": "/dev/null", "cwd": cwd,
            "permission_mode": "default", "hook_event_name": name, "tool_name": "Bash",
            "tool_input": {"command": command}, "tool_use_id": "t"}
    if name == "PostToolUse":
        data["tool_response"] = {"stdout": "", "stderr": "", "interrupted": False}
    return json.dumps(data).encode()


def timed(argv: list[str], stdin: bytes, env: dict[str, str], cwd: str) -> tuple[float, bytes, bytes, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, input=stdin, env=env, cwd=cwd, capture_output=True)
    return time.perf_counter() - t0, proc.stdout, proc.stderr, proc.returncode


CONSOLE_SCRIPT = """import sys
from dispatch.cli.entry import entry
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(entry())
"""


def imported(python: str, script: str, config: str, env: dict[str, str], cwd: str,
             name: str = "pre-tool-use") -> list[str]:
    """Which of pydantic, rich, sqlite3 the light path of hook ``name`` imports (``-X importtime``)."""
    argv = [python, "-X", "importtime", script, "hook", name, "--config", config]
    data = event(LIGHT[0], cwd, "PostToolUse" if name == "post-tool-use" else "PreToolUse")
    err = subprocess.run(argv, input=data, env=env, cwd=cwd, capture_output=True).stderr
    names = {line.split("|")[-1].strip() for line in err.decode().splitlines()
             if line.startswith("import time:")}
    return [m for m in HEAVY_MODULES if m in names]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="measured runs of each series (>= 20)")
    ap.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    args = ap.parse_args()
    if args.runs < 20:
        ap.error("--runs must be at least 20 (medians of >= 20 runs)")
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-hook-")
    slice_dir = None
    try:
        config, slice_dir = write_config(tmp, "1G")
        with open(config, "a", encoding="utf-8") as fh:
            fh.write('\n[agents]\nmode = "remind"\n')
        project = os.path.join(tmp, "project")
        os.makedirs(os.path.join(project, "src"))
        env = dict(private_env(tmp), PYTHONPATH=ROOT)
        env_cached = dict(env, PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        env_cached.pop("PYTHONDONTWRITEBYTECODE", None)
        python = args.python
        script = os.path.join(tmp, "hostrun")  # what pip writes as the console script
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(f"#!{python}\n{CONSOLE_SCRIPT}")
        hook = [python, script, "hook", "pre-tool-use", "--config", config]
        series = [("python -c pass", [python, "-c", "pass"], b"", env)]
        series += [(f"light: {c}", hook, event(c, project), env) for c in LIGHT]
        series += [(f"light, python -m dispatch: {LIGHT[0]}",
                    [python, "-m", "dispatch", *hook[2:]], event(LIGHT[0], project), env)]
        post = [python, script, "hook", "post-tool-use", "--config", config]
        series += [(POST, post, event(LIGHT[0], project, "PostToolUse"), env)]
        series += [(f"heavy (remind, report): {HEAVY}", hook, event(HEAVY, project), env)]
        series += [(f"light [*]: {c}", hook, event(c, project), env_cached) for c in LIGHT]
        series += [(f"{POST} [*]", post, event(LIGHT[0], project, "PostToolUse"), env_cached)]
        for label, argv, stdin, run_env in series:  # warm-up: validates and caches the config
            _, out, err, rc = timed(argv, stdin, run_env, project)
            expect_answer = label.startswith("heavy")
            if rc != 0 or err or bool(out) != expect_answer:
                print(f"unexpected result for {label}: rc={rc} out={out[:200]!r} err={err[:300]!r}",
                      file=sys.stderr)
                return 1
        print(f"interpreter: {python}; dispatch from {ROOT}")
        print(f"machine:     {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
              f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
        times: dict[str, list[float]] = {label: [] for label, _, _, _ in series}
        for i in range(args.runs):
            k = i % len(series)
            for label, argv, stdin, run_env in series[k:] + series[:k]:
                times[label].append(timed(argv, stdin, run_env, project)[0])
        print(f"\n{args.runs} runs each, interleaved; wall time in ms")
        base = ratio_table(times, [label for label, _, _, _ in series], 60)
        light_all = [t for c in LIGHT for t in times[f"light: {c}"]]
        ratio = statistics.median(light_all) / base
        heavy_modules = imported(python, script, config, env, project)
        post_ratio = statistics.median(times[POST]) / base
        post_modules = imported(python, script, config, env, project, "post-tool-use")
        verdict = "PASS" if ratio <= TARGET_RATIO and not heavy_modules else "FAIL"
        post_verdict = "PASS" if post_ratio <= TARGET_RATIO and not post_modules else "FAIL"
        print(f"\n  light commands (pooled) / python -c pass: {ratio:.2f}x "
              f"(+{(statistics.median(light_all) - base) * 1000:.1f} ms); target <= {TARGET_RATIO:.0f}x; "
              f"pydantic/rich/sqlite3 imported on the light path: {', '.join(heavy_modules) or 'none'} "
              f"-> {verdict}")
        print(f"  {POST} / python -c pass: {post_ratio:.2f}x; target <= {TARGET_RATIO:.0f}x; "
              f"pydantic/rich/sqlite3 imported: {', '.join(post_modules) or 'none'} -> {post_verdict}")
        cached = [t for c in LIGHT for t in times[f"light [*]: {c}"]]
        print(f"  [*] with dispatch's bytecode cached (private PYTHONPYCACHEPREFIX): "
              f"{statistics.median(cached) / base:.2f}x; {POST}: "
              f"{statistics.median(times[f'{POST} [*]']) / base:.2f}x")
        left = leftovers(os.path.join(tmp, "state"), slice_dir)
        for line in left:
            print(f"  LEFT BEHIND: {line}")
        return 0 if verdict == post_verdict == "PASS" and not left else 1
    finally:
        remove_slice(slice_dir)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
