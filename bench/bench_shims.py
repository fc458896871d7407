"""Benchmark: what a PATH shim (``hostrun shims install``) costs on a light invocation.

``cargo --version`` through three forms of a shim, against the fake ``cargo`` run directly, all
interleaved in the same run: the shim ``hostrun shims install`` writes (a Python script run by
hostrun's interpreter with ``-I``), and the alternative it was measured against, a ``#!/bin/sh``
script that execs that interpreter with the same code (one more process image). Prints the medians
and the ratio of each to the bare tool, with the interpreter's own start (``python -I -c pass``).
No root needed. Run by hand, e.g.::

    .venv/bin/python bench/bench_shims.py --runs 30
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dispatch.hooks.shims import shim_text  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        real, py_dir, sh_dir = (os.path.join(tmp, d) for d in ("bin", "py", "sh"))
        for d in (real, py_dir, sh_dir):
            os.mkdir(d)
        files = {os.path.join(real, "cargo"): "#!/bin/sh\necho fake cargo\n",
                 os.path.join(py_dir, "cargo"): shim_text("cargo")}
        code = "".join(shim_text("cargo").splitlines(keepends=True)[2:]).replace("__file__", repr(
            os.path.join(sh_dir, "cargo")))
        exec_line = f'exec {sys.executable} -I -c {shlex.quote(code)} "$@"'
        files[os.path.join(sh_dir, "cargo")] = f"#!/bin/sh\n# hostrun-shim: cargo (bench)\n{exec_line}\n"
        for path, text in files.items():
            with open(path, "w") as fh:
                fh.write(text)
            os.chmod(path, 0o755)
        forms = {"bare tool": real, "python shim": py_dir, "sh shim": sh_dir}
        times: dict[str, list[float]] = {name: [] for name in forms}
        times["python -I -c pass"] = []
        for _ in range(args.runs):
            for name, first in forms.items():
                env = {**os.environ, "PATH": f"{first}:{real}:{os.environ['PATH']}"}
                env.pop("HOSTRUN_JOB", None)
                times[name].append(timed(["cargo", "--version"], env))
            times["python -I -c pass"].append(timed([sys.executable, "-I", "-c", "pass"], dict(os.environ)))
    base = statistics.median(times["bare tool"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:18} median {median * 1000:7.1f} ms  ({median / base:5.1f}x the bare tool)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
