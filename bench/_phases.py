"""``hostrun`` as its console script runs it, with the CPU it spends in each phase of a local run
written to ``$HOSTRUN_BENCH_PHASES`` (one JSON line per process, appended). For
``bench_concurrency.py --phases``; standard library only.

The phases are marked by wrapping a few of hostrun's own functions (its internals: a rename there
makes this script fail loudly, never measure something else; it imports nothing hostrun would not,
until hostrun is done). Each mark is (name, monotonic time,
this process's CPU time, ``time.process_time``); the CPU of the forked children (the guardian, the
job before its exec) is not in it.

  start        the interpreter's own start, to this script's first line
  imports      hostrun's imports up to the run (dispatch.cli.main, runcmd, the runner)
  to_queue     options, config, slice, job cgroup, guardian, the job's fork, ledger, enqueue
  waiting      admission: every try, peek and wake-up until admitted (first try included)
  to_exec      admitted to the job's exec
  job          while the job runs (the watch: memory samples)
  to_release   the job's end to its booking released (verdict, peak and history, release)
  to_exit      released to exit (cgroup removed, guardian dismissed, result file)
"""

from __future__ import annotations

import os
import sys
import time

MARKS: list[tuple[str, float, float]] = []


def mark(name: str) -> None:
    MARKS.append((name, time.monotonic(), time.process_time()))


def wrap(owner: object, attr: str, before: str | None, after: str | None) -> None:
    original = getattr(owner, attr)

    def wrapper(*args: object, **kwargs: object) -> object:
        if before:
            mark(before)
        result = original(*args, **kwargs)
        if after:
            mark(after)
        return result

    setattr(owner, attr, wrapper)


def main() -> None:
    mark("started")
    import dispatch.cli.main  # noqa: F401  (what the console script imports first)
    from dispatch.cli import entry
    from dispatch.local import jobwatch, ledger, runner, spawn

    mark("imported")
    wrap(runner, "wait_for_room", "queued", "admitted")
    wrap(spawn.PreparedChild, "go", None, "exec")
    wrap(jobwatch.JobWatch, "wait", None, "job_end")
    wrap(ledger.Ledger, "release", None, "released")
    out = os.environ["HOSTRUN_BENCH_PHASES"]

    def leave(code: int) -> None:
        mark("exit")
        import json  # only now: hostrun's own path may not load it (its cost would show as hostrun's)

        line = json.dumps({"pid": os.getpid(), "code": code, "marks": MARKS}) + "\n"
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
