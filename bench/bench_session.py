#!/usr/bin/env python3
"""What an agent session under the budget costs (issue 39): ``hostrun session``'s start, the time a
session that balloons past its cap takes to end, and the time a session started without the wrapper
takes to be placed at its SessionStart.

What is measured, in the same run:

* **start**: median wall time of ``hostrun session -- true`` against ``hostrun -- true`` and a bare
  ``python -c pass`` (``--runs`` each, alternated);
* **end at the cap**: a session (``-m 128M``) whose tool allocates 512 MiB while its agent (``sh``)
  would go on sleeping: from the session's start to its exit 250 (cgroup v1 kills only the tool;
  hostrun ends the whole session at its next look, every 0.25 s), against the same allocation run
  as a plain job (250 at once: the job is the tool);
* **placing**: a stand-in agent (a Python process with a tool child) runs the SessionStart hook as
  Claude Code does (``sh -c``, the recorded event): from the hook's start to both processes being in
  the session's cgroup (a detached process books, waits for admission and moves them).

Isolation: a private config, state dir and slice cgroup (removed at the end). Standard library only
(the stand-in agent comes from tests/system/test_session_place.py). Run as root on a cgroup v1 or v2
machine::

    .venv/bin/python bench/bench_session.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _common import find_hostrun, interpreter_of, private_env, remove_slice, write_config

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    code = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True).returncode
    return time.perf_counter() - t0, code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hostrun", help="the hostrun to measure (default: .venv/bin/hostrun)")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    hostrun = find_hostrun(args.hostrun)
    python = interpreter_of(hostrun)
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-session-")
    slice_dir = None
    try:
        config, slice_dir = write_config(tmp, "2G")
        with open(config, "a", encoding="utf-8") as fh:
            fh.write('\n[sessions]\nplace = true\ncap = "256M"\nfirst_booking = "64M"\n')
        env = private_env(tmp)
        base = [hostrun, "--config", config]
        print(f"hostrun: {hostrun}; machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        timed([*base, "--", "true"], env)  # warm-up: the config validated, the engine started

        series: dict[str, list[float]] = {"python -c pass": [], "hostrun -- true": [],
                                          "hostrun session -- true": []}
        argvs = {"python -c pass": [python, "-c", "pass"], "hostrun -- true": [*base, "--", "true"],
                 "hostrun session -- true": [*base, "session", "--", "true"]}
        for _ in range(args.runs):
            for name, argv in argvs.items():
                wall, code = timed(argv, env)
                assert code == 0, (name, code)
                series[name].append(wall)
        bare = statistics.median(series["python -c pass"])
        print("\nstart (median wall time of", args.runs, "runs each)")
        for name, walls in series.items():
            med = statistics.median(walls)
            print(f"  {name:26} {med * 1000:7.1f} ms  {med / bare:5.2f}x python")

        balloon = f"{python} -c 'x = bytearray(512 << 20)'"
        session_wall, session_code = timed([*base, "session", "--label", "balloon", "-m", "128M", "--",
                                            "sh", "-c", f"{balloon}; sleep 60"], env)
        job_wall, job_code = timed([*base, "-m", "128M", "--", "sh", "-c", balloon], env)
        print("\nend at the cap (128 MiB cap, the tool allocates 512 MiB)")
        print(f"  session (agent goes on): exit {session_code} after {session_wall:.2f} s")
        print(f"  job (the tool alone):    exit {job_code} after {job_wall:.2f} s "
              f"(the session's whole-kill adds {session_wall - job_wall:+.2f} s)")

        sys.path.insert(0, os.path.dirname(HERE))
        from tests.support.agentsessions import AGENT
        from tests.support.claude import event

        agent = os.path.join(tmp, "agent.py")
        with open(agent, "w", encoding="utf-8") as fh:
            fh.write(AGENT)
        placings = []
        for i in range(5):
            where, go = os.path.join(tmp, f"where{i}"), os.path.join(tmp, f"go{i}")
            hook = shlex.join([*base, "hook", "session-start"])
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, agent, hook, where, go], stdin=subprocess.PIPE,
                                    text=True, env=env)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(event("session_start_startup", cwd=tmp)))
            proc.stdin.close()
            while not (os.path.exists(where) and open(where).read().count("/sessions/session-") == 2):
                if time.perf_counter() - t0 > 60:
                    raise SystemExit("not placed within 60 s")
                time.sleep(0.01)
            placings.append(time.perf_counter() - t0)
            with open(go, "w") as fh:
                fh.write("end")
            proc.wait(timeout=60)
        print("\nplacing a running session at its SessionStart (5 stand-in agents, one after another)")
        print(f"  hook started -> agent and its tool in the session cgroup: median "
              f"{statistics.median(placings) * 1000:.0f} ms, max {max(placings) * 1000:.0f} ms")
        return 0
    finally:
        time.sleep(1)
        remove_slice(slice_dir)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
