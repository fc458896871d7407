"""``hostrun`` as its console script runs it, with the CPU it spends in each phase of a local run
written to ``$HOSTRUN_BENCH_PHASES`` (one JSON line per process, appended). For
``bench_concurrency.py --phases``; standard library only.

The phases are marked by wrapping a few of hostrun's own functions (its internals: a rename there
makes this script fail loudly, never measure something else; it imports nothing hostrun would not,
until hostrun is done). Each mark is (name, monotonic time,
this process's CPU time, ``time.process_time``); the CPU of the forked children (the guardian, the
job before its exec) is not in it.

  start        the interpreter's own start, to this script's first line
  imports      hostrun's imports up to the run (dispatch.cli.main, runcmd, the front door)
  to_queue     options, config, the engine's connection, the plan request queued
  waiting      admission: blocked in a read until the engine says admitted
  to_exec      admitted to the job's exec (the runner imported, slice, job cgroup, guardian, fork)
  job          while the job runs (the watch: memory samples)
  to_release   the job's end to its booking released (verdict, peak and history, release)
  to_exit      released to exit (cgroup removed, guardian dismissed, result file)

For the slot hand-off (``handoffs``: one job's end to the next waiter's exec, phase by phase, wall
time) more marks are taken, each with the monotonic clock every process shares: the verdict
(``judged``), the peak and history (``recorded``), the release sent and answered (``releasing``,
``released``), the waiter's admission message read (``admitted``), its ``go`` and exec. What the
engine does between a release and the next admission is in its own process: the ``engine`` step.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

MARKS: list[tuple[str, float, float]] = []
OFFSET = time.time() - time.monotonic()  # wall clock - monotonic: the jobs' own stamps are wall clock


def mark(name: str) -> None:
    MARKS.append((name, time.monotonic(), time.process_time()))


def wrap(owner: object, attr: str, before: str | None, after: str | None,
         named: Callable[[tuple[object, ...], object], str] | None = None,
         named_before: Callable[[tuple[object, ...]], str] | None = None) -> None:
    """Mark ``before`` and ``after`` a call; ``named(args, result)``: the after mark's name,
    ``named_before(args)`` the before mark's."""
    original = getattr(owner, attr)

    def wrapper(*args: object, **kwargs: object) -> object:
        if named_before is not None:
            mark(named_before(args))
        elif before:
            mark(before)
        result = original(*args, **kwargs)
        if named is not None:
            mark(named(args, result))
        elif after:
            mark(after)
        return result

    setattr(owner, attr, wrapper)


def main() -> None:
    mark("started")
    import dispatch.cli.main  # noqa: F401  (what the console script imports first)
    from dispatch.cli import entry
    from dispatch.local.engine import admitclient  # (hostrun: the runner once admitted)
    from dispatch.local.run import jobwatch, runner, spawn

    mark("imported")
    wrap(admitclient.Link, "plan", None, "queued")
    wrap(admitclient.Link, "wait", None, "admitted")
    wrap(spawn.PreparedChild, "go", "go", "exec")
    wrap(jobwatch.JobWatch, "wait", None, "job_end")
    wrap(admitclient.Link, "release", "releasing", "released")
    # the hand-off's steps (see the docstring)
    wrap(runner, "_run", None, "judged")
    wrap(runner._LocalRun, "record", None, "recorded")
    out = os.environ["HOSTRUN_BENCH_PHASES"]

    def leave(code: int) -> None:
        mark("exit")
        import json  # only now: hostrun's own path may not load it (its cost would show as hostrun's)

        line = json.dumps({"pid": os.getpid(), "code": code, "marks": MARKS, "offset": OFFSET,
                           "argv": sys.argv[-1]}) + "\n"
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

    entry.leave = leave  # type: ignore[assignment]
    entry.entry()


PHASES = (("start", None, "started"), ("imports", "started", "imported"),
          ("to_queue", "imported", "queued"), ("waiting", "queued", "admitted"),
          ("to_exec", "admitted", "exec"), ("job", "exec", "job_end"),
          ("to_release", "job_end", "released"), ("to_exit", "released", "exit"))


def per_phase(path: str) -> tuple[int, dict[str, list[float]]]:
    """(processes read, CPU seconds per phase for each process that went through all of them)."""
    import json

    spent: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}
    count = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            count += 1
            cpu = {name: c for name, _, c in json.loads(line)["marks"]}
            if not all(end in cpu for _, _, end in PHASES):
                continue
            for name, begin, end in PHASES:
                spent[name].append(cpu[end] - (cpu[begin] if begin else 0.0))
    return count, spent


if __name__ == "__main__":
    sys.path.pop(0)  # this script's directory (bench/): hostrun's modules come from where they would
    main()


# ---------------------------------------------------------------- the slot hand-off, wall time
# Each step from one job's end to the next job's exec, in order: (name, what it is). The first is the
# job's own last stamp (its ``date``) to hostrun seeing its end; the last, the next job's exec to its
# own first stamp (``sh`` and ``date`` starting).
HANDOFF_STEPS = (
    ("end_seen", "job's last stamp -> its hostrun sees the end (exit, pidfd, reap)"),
    ("verdict", "-> verdict and peak read (kill_all, counters, ramp)"),
    ("record", "-> peak and history written (the engine's record request)"),
    ("to_release", "-> release begins (attempt returns; child reaped, cgroup killed again)"),
    ("engine", "-> the next waiter reads admitted (release, the engine's try, its message)"),
    ("to_go", "-> go (the runner imported, slice, cgroup, guardian, fork)"),
    ("exec", "-> the job's exec seen by hostrun (pipe, oom_score_adj, execve)"),
    ("job_start", "-> the job's first stamp (sh, date)"),
)


def _load(path: str) -> list[dict[str, object]]:
    import json

    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _first(marks: list[list[object]], name: str, after: float = float("-inf"),
           before: float = float("inf")) -> tuple[float, float] | None:
    """(monotonic, cpu) of the first mark called ``name`` (or starting with it) in (after, before]."""
    for n, t, c in marks:
        if (n == name or str(n).startswith(name + " ")) and after < t <= before:  # type: ignore[operator]
            return float(t), float(c)  # type: ignore[arg-type]
    return None


def _last(marks: list[list[object]], name: str, before: float = float("inf"),
          after: float = float("-inf")) -> tuple[float, float] | None:
    found = None
    for n, t, c in marks:
        if (n == name or str(n).startswith(name + " ")) and after < t <= before:  # type: ignore[operator]
            found = float(t), float(c)  # type: ignore[arg-type]
    return found


def handoffs(path: str, stamps: dict[str, tuple[float, float]]) -> dict[str, object]:
    """The hand-offs in one run: each job admitted after it had waited, matched with the last
    release sent before its admission (another hostrun's), split into ``HANDOFF_STEPS`` (seconds,
    wall). ``stamps``: the jobs' own (first, last) wall-clock stamps by their stamp file (the last
    argument of each hostrun).

    Returns {"clean": [{step: seconds, ..., "total": s, "steady": bool, "cpu_release": s,
    "cpu_admit": s}], "first_try": n, "unmatched": n}. ``steady``: the waiter had queued before the
    releasing job ended (the queue was formed; not the start-up burst). ``cpu_release``: the
    releasing hostrun's CPU from the job's end to its release answered; ``cpu_admit``: the waiter's
    from its admission to its exec."""
    procs = _load(path)
    releases: list[tuple[float, dict[str, object]]] = []
    for p in procs:
        marks = p["marks"]
        assert isinstance(marks, list)
        releases.extend((float(t), p) for n, t, _ in marks if n == "releasing")  # type: ignore[arg-type]
    releases.sort(key=lambda r: r[0])
    clean: list[dict[str, float | bool]] = []
    first_try = unmatched = 0
    for b in procs:
        marks = b["marks"]
        assert isinstance(marks, list)
        admitted, queued = _first(marks, "admitted"), _first(marks, "queued")
        if admitted is None or queued is None:
            continue
        if admitted[0] - queued[0] < 0.002:  # admitted at once: no hand-off
            first_try += 1
            continue
        before = [r for r in releases if r[0] <= admitted[0] and r[1] is not b]
        if not before:
            unmatched += 1
            continue
        at, a = before[-1]
        a_marks = a["marks"]
        assert isinstance(a_marks, list)
        job_end = _last(a_marks, "job_end", before=at)
        judged = _last(a_marks, "judged", before=at)
        recorded = _last(a_marks, "recorded", before=at)
        released = _first(a_marks, "released", after=at)
        go = _first(marks, "go", after=admitted[0])
        exec_ = _first(marks, "exec", after=admitted[0])
        a_stamps = stamps.get(str(a["argv"]))
        b_stamps = stamps.get(str(b["argv"]))
        if None in (job_end, judged, recorded, go, exec_) or not a_stamps or not b_stamps:
            unmatched += 1
            continue
        a_off, b_off = float(a["offset"]), float(b["offset"])  # type: ignore[arg-type]
        a_last = a_stamps[1] - a_off
        b_first = b_stamps[0] - b_off
        points = [a_last, job_end[0], judged[0], recorded[0], at, admitted[0], go[0], exec_[0],  # type: ignore[index]
                  b_first]
        row: dict[str, float | bool] = {
            name: points[i + 1] - points[i] for i, (name, _) in enumerate(HANDOFF_STEPS)}
        row["total"] = b_first - a_last
        row["steady"] = queued[0] < job_end[0]  # type: ignore[index]
        row["cpu_release"] = (released[1] if released else at) - job_end[1]  # type: ignore[index]
        row["cpu_admit"] = exec_[1] - admitted[1]  # type: ignore[index]
        clean.append(row)
    return {"clean": clean, "first_try": first_try, "unmatched": unmatched}


def handoff_lines(found: dict[str, object]) -> list[str]:
    """The hand-off table: median / p90 ms per step, all clean hand-offs and the steady ones."""
    clean = found["clean"]
    assert isinstance(clean, list)
    steady = [r for r in clean if r["steady"]]
    out = [f"  slot hand-off, wall time per step (ms; {len(clean)} hand-offs after a release, "
           f"{len(steady)} of them with the waiter queued before the job ended; "
           f"{found['first_try']} admitted at once, {found['unmatched']} not matched):",
           f"    {'step':<11} {'all p50':>8} {'p90':>7} {'steady p50':>11} {'p90':>7}   what"]

    def q(rows: list[dict[str, float | bool]], key: str, p: float) -> str:
        values = sorted(float(r[key]) * 1000 for r in rows)
        if not values:
            return "-"
        if p == 50:
            return f"{statistics.median(values):.1f}"
        return f"{values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]:.1f}"

    for key, what in (*HANDOFF_STEPS, ("total", "job end -> next job's first stamp"),
                      ("cpu_release", "CPU: releasing hostrun, end seen -> released"),
                      ("cpu_admit", "CPU: admitted waiter, admitted -> exec")):
        out.append(f"    {key:<11} {q(clean, key, 50):>8} {q(clean, key, 90):>7} "
                   f"{q(steady, key, 50):>11} {q(steady, key, 90):>7}   {what}")
    return out
