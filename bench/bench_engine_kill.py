#!/usr/bin/env python3
"""The admission engine SIGKILLed at ``--kills`` (20) random moments while a swarm of ``--jobs`` (300)
drains through a slice of ``--slots`` (8): what its death costs the runs it admits.

What is measured
----------------
``--jobs`` ``hostrun -m CAP --label kill-I -- sh -c 'date >> ts; sleep S; date >> ts'`` are started
at once (``--batch`` at a time) against a private slice of ``--slots`` x ``--cap-mib``. While they
drain, the engine of the state dir is found in /proc and SIGKILLed at ``--kills`` moments drawn
uniformly over the span of the same swarm without kills (measured first; ``4 x jobs x sleep /
slots`` with ``--no-baseline``), each once the previous engine was replaced (one killed as it
starts counts). Every ``--sample`` seconds the ledger's bookings are read (read-only).

* **nothing over-admitted**: the sum of the running bookings never above the slice, at every sample;
  and the most jobs running at once (from the stamps) never above the slots;
* **no job lost or killed**: every run exits 0 and ran exactly once;
* **nothing left**: no booking, job cgroup or process at the end;
* the drain against the same swarm with no kill, measured first in the same run (``--no-baseline``
  skips it): what the deaths cost in time.

Target (issue 38): all of the above with 20 kills during a 300-job swarm. Run by hand as root, e.g.::

    .venv/bin/python bench/bench_engine_kill.py --jobs 300 --kills 20
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

from _common import (
    engines,
    failure_lines,
    find_hostrun,
    launch_swarm,
    leftovers,
    max_overlap,
    private_env,
    remove_slice,
    stamp_times,
    swarm_arguments,
    write_config,
)


def _running_bytes(db: str) -> int | None:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT coalesce(sum(size), 0) FROM bookings WHERE state = 'running'"
                               ).fetchone()
        finally:
            conn.close()
        return int(row[0])
    except sqlite3.Error:
        return None


def swarm(args: argparse.Namespace, hostrun: str, kills: int, spread: float) -> dict[str, object]:
    """One swarm, ``kills`` engine deaths at moments drawn over its first ``spread`` seconds."""
    slice_bytes = args.slots * args.cap_mib << 20
    tmp = tempfile.mkdtemp(prefix="hostrun-kill-")
    config, slice_dir = write_config(tmp, f"{args.slots * args.cap_mib}M")
    state_dir = os.path.join(tmp, "state")
    db = os.path.join(state_dir, "ledger.sqlite3")
    env = private_env(tmp)
    base = [hostrun, "--config", config]
    subprocess.run([*base, "--", "true"], env=env, check=True, capture_output=True)
    ideal = args.jobs * args.sleep / args.slots
    moments = sorted(random.uniform(0, spread) for _ in range(kills))
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    stamps = launch_swarm(procs, base, env, tmp, args, "kill")
    killed, over, samples, worst = 0, 0, 0, 0
    last_sample = 0.0
    while any(p.poll() is None for p in procs):
        now = time.monotonic() - started
        if time.monotonic() - started > args.timeout:
            for p in procs:
                p.kill()
            break
        if moments and now >= moments[0]:
            found = engines(state_dir)
            if found:  # one at a time: the next kill waits for a replacement
                moments.pop(0)
                for pid in found:
                    os.kill(pid, signal.SIGKILL)
                killed += 1
        if now - last_sample >= args.sample:
            last_sample = now
            booked = _running_bytes(db)
            if booked is not None:
                samples += 1
                worst = max(worst, booked)
                over += booked > slice_bytes
        time.sleep(0.01)
    drain = time.monotonic() - started
    codes = collections.Counter(p.returncode for p in procs)
    said = failure_lines(tmp, procs)
    runs = [stamp_times(s) for s in stamps]
    for pid in engines(state_dir):
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    left = leftovers(state_dir, slice_dir)
    remove_slice(slice_dir)
    return {"killed": killed, "drain": drain, "ideal": ideal, "codes": codes, "said": said,
            "once": sum(1 for r in runs if len(r) == 2), "overlap": max_overlap(
                [(r[0], r[1]) for r in runs if len(r) == 2]), "samples": samples, "over": over,
            "worst": worst, "slice": slice_bytes, "left": left}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    swarm_arguments(p, jobs=300, batch_pause=0.3)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--sample", type=float, default=0.05, help="seconds between ledger samples")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-baseline", action="store_true", help="skip the swarm without kills")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    random.seed(seed)
    hostrun = find_hostrun(args.hostrun)
    print(f"engine kills: {args.jobs} x hostrun -m {args.cap_mib}M -- sh -c '...; sleep {args.sleep}' "
          f"on {args.slots} slots, {args.kills} SIGKILLs of the engine (seed {seed}); load "
          f"{os.getloadavg()[0]:.1f}")
    ideal = args.jobs * args.sleep / args.slots
    baseline = None if args.no_baseline else swarm(args, hostrun, 0, 0.0)
    # the kills spread over the swarm's real span (launch and drain), as measured without them
    result = swarm(args, hostrun, args.kills, float(baseline["drain"]) if baseline else 4 * ideal)
    for name, r in (("no kill", baseline), ("killed", result)):
        if r is None:
            continue
        print(f"  {name}: {r['killed']} kills; exit codes {dict(r['codes'])}; ran once {r['once']} of "
              f"{args.jobs}; most at once {r['overlap']} (slots {args.slots}); running bookings sampled "
              f"{r['samples']} times, at most {int(r['worst']) >> 20} MiB of {int(r['slice']) >> 20}, "
              f"over the slice {r['over']} times; drain {r['drain']:.1f} s "
              f"({float(r['drain']) / float(r['ideal']):.2f}x the ideal {r['ideal']:.1f} s)")
        for line, count in r["said"].most_common(5):  # type: ignore[attr-defined]
            print(f"    {count} x {line}")
        for line in r["left"][:5]:  # type: ignore[index]
            print(f"    left: {line}")
    if baseline is not None:
        print(f"  the kills cost {float(result['drain']) / float(baseline['drain']):.2f}x the drain without")
    checks = [
        (f"{result['killed']} of {args.kills} kills made", result["killed"] == args.kills),
        ("never more booked than the slice", result["over"] == 0),
        (f"never more running than the slots ({result['overlap']})", int(result["overlap"]) <= args.slots),
        (f"every job ran once and exited 0 ({result['codes'].get(0, 0)})",  # type: ignore[attr-defined]
         result["codes"].get(0, 0) == args.jobs and result["once"] == args.jobs),  # type: ignore[attr-defined]
        ("nothing left booked, in a cgroup or running", not result["left"]),
    ]
    failed = 0
    for text, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'} {text}")
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
