"""A burst of concurrent runs right after a config edit (cold config cache) against the same burst with
the cache warm, in the same run.

On a cache miss hostrun validates the file with pydantic (~150 ms of imports and CPU). Before the
cache was validated under a lock, every run of a burst that started after an edit did that work
(100 concurrent runs: 9.7 s cold against 3.7 s warm); now one run validates and the others wait for
its result. Target: the cold burst's wall time <= 1.5x the warm burst's (median of the rounds).

    .venv/bin/python bench/bench_cold_config.py [--jobs 50] [--rounds 5] [--source DIR]

Runs are ``python -m dispatch`` with this interpreter and ``PYTHONPATH=DIR`` (default: this checkout),
so an older checkout can be measured the same way for a before/after.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import leftovers, private_env, remove_slice, write_config

TARGET = 1.5


def burst(hostrun: list[str], config: str, env: dict[str, str], jobs: int) -> tuple[float, int, int]:
    """Wall time of ``jobs`` concurrent ``hostrun -- true`` runs, how many failed, and how many
    imported pydantic (counted only when ``hostrun`` runs Python with ``-X importtime``)."""
    # A barrier: each run waits in a shell on a FIFO until it is opened for writing and closed, so
    # all start at the same moment (spawning them one by one would let the first warm the cache).
    gate = os.path.join(os.path.dirname(config), "gate")
    if os.path.exists(gate):
        os.unlink(gate)
    os.mkfifo(gate, 0o600)
    procs = [subprocess.Popen(["sh", "-c", 'cat "$0" >/dev/null; exec "$@"', gate, *hostrun, "--config",
                               config, "--", "true"], env=env, stdout=subprocess.DEVNULL,
                              cwd=os.path.dirname(config),  # python -m puts the cwd first on sys.path
                              stderr=subprocess.PIPE) for _ in range(jobs)]
    time.sleep(0.5 + jobs * 0.01)  # every shell is blocked on the FIFO by now
    started = time.monotonic()
    os.close(os.open(gate, os.O_WRONLY))
    failed = validated = 0
    for proc in procs:
        _, err = proc.communicate()
        text = err.decode(errors="replace")
        validated += "pydantic" in text  # an import-time line names each module imported
        if proc.returncode != 0:
            failed += 1
            print(f"  run failed (exit {proc.returncode}): {text.strip()[-300:]}")
    return time.monotonic() - started, failed, validated


def edit(config: str, round_no: int, env: dict[str, str]) -> dict[str, str]:
    """Change the file (a comment), so its cache entry no longer matches, and point the runs at a
    cache directory of their own that does not exist yet: the next runs must validate. Returns the
    environment for them."""
    with open(config, encoding="utf-8") as fh:
        lines = [line for line in fh if not line.startswith("# bench round")]
    lines.append(f"# bench round {round_no}\n")
    with open(config, "w", encoding="utf-8") as fh:
        fh.writelines(lines)
    return {**env, "XDG_CACHE_HOME": os.path.join(os.path.dirname(config), f"cache-{round_no}")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the checkout whose dispatch/ is measured (default: this one)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="slow start-up: dispatch's bytecode neither read nor written (an empty "
                         "PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE=1), as on a fresh or read-only "
                         "install; the runs of a burst then overlap for longer")
    args = ap.parse_args()
    hostrun = [sys.executable, "-m", "dispatch"]
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-cold-")
    os.chmod(tmp, 0o700)
    config, slice_dir = write_config(tmp, "2G")
    with open(config, "a", encoding="utf-8") as fh:
        fh.write('gamble_size = "4M"\n')  # every run of the burst fits at once: no queueing measured
    env = {**private_env(tmp), "PYTHONPATH": os.path.abspath(args.source)}
    if args.no_bytecode:
        env.update(PYTHONPYCACHEPREFIX=os.path.join(tmp, "no-pycache"), PYTHONDONTWRITEBYTECODE="1")
    try:
        print(f"hostrun: {' '.join(hostrun)} with PYTHONPATH={env['PYTHONPATH']}"
              f"{' (no bytecode)' if args.no_bytecode else ''}\nconfig:  {config}\n"
              f"machine: {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.2f}\n{args.jobs} concurrent 'hostrun -- true' per burst, "
              f"{args.rounds} rounds, cold and warm interleaved\n")
        _, failed, _ = burst(hostrun, config, env, 1)
        if failed:
            return 1
        cold: list[float] = []
        warm: list[float] = []
        failures = 0
        for round_no in range(args.rounds):
            round_env = edit(config, round_no, env)
            seconds, failed, _ = burst(hostrun, config, round_env, args.jobs)
            cold.append(seconds)
            failures += failed
            seconds, failed, _ = burst(hostrun, config, round_env, args.jobs)
            warm.append(seconds)
            failures += failed
            print(f"  round {round_no + 1}: cold {cold[-1]:.2f} s, warm {warm[-1]:.2f} s")
        ratio = statistics.median(cold) / statistics.median(warm)
        print(f"\nmedian burst wall time: cold {statistics.median(cold):.2f} s, "
              f"warm {statistics.median(warm):.2f} s")
        # One more cold burst, untimed, each run logging its imports: how many validated the file.
        round_env = edit(config, args.rounds, env)
        profiled = [sys.executable, "-X", "importtime", "-m", "dispatch"]
        _, failed, validated = burst(profiled, config, round_env, args.jobs)
        failures += failed
        print(f"cold burst with import logging: {validated} of {args.jobs} runs imported pydantic "
              "(validated the file)")
        verdict = "PASS" if ratio <= TARGET and not failures else "FAIL"
        print(f"ratio cold / warm: {ratio:.2f}x   target: <= {TARGET}x  -> {verdict}")
        left = leftovers(os.path.join(tmp, "state"), slice_dir)
        print(f"leftovers after all runs: {', '.join(left) or 'none'}")
        return 0 if verdict == "PASS" and not left else 1
    finally:
        remove_slice(slice_dir)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
