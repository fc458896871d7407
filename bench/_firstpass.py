"""First-pass references for ``bench_backfill.py``: hostrun's first pass with ``--requeue`` (no
recorded peak or duration), simulated with zero overheads, under its own rule and under rules it
does not have, so the real row can be told apart from what its policy allows at all.

The model, as hostrun runs a first pass (docs/admission.md, "Requeue", "The guess"): every job is
booked as a gamble at ``dispatch.local.admission.booking.guess`` (half its cap, lowered by the peaks of the
program's last 20 clean runs), oom_score_adj 1000; each uses what ``job.py`` holds over time
(``_packsim.ramp_profile``) plus the interpreter's own pages. Room is the slice less the running
bookings and the use above them, as admission counts it. When the running jobs' use passes the
slice, the kernel kills the one with the highest badness (use + adj x slice / 1000, as
``oom_badness`` in a memory cgroup); it is requeued at its cap (oom_score_adj 0) in its old place.
Time advances in steps of ``dt`` (10 ms): deterministic, not event-exact.

Policies: ``fifo`` is hostrun's (its EASY backfill has no durations on a first pass, so nothing
jumps the head); ``easy-program`` gives EASY (``backfill.shadow``/``jump`` themselves) the longest
of the program's recent runs as every job's duration, as the guess does for peaks; ``greedy`` starts
any waiter that fits, the head unprotected (what ``xargs``-like packing would do, with hostrun's
bookings).
"""

from __future__ import annotations

from collections.abc import Sequence

from _packsim import EPS, MIB, Job, duration, ramp_profile

from dispatch.local.admission.backfill import estimate, shadow
from dispatch.local.admission.backfill import jump as may_jump
from dispatch.local.admission.booking import guess

POLICIES = ("fifo", "easy-program", "greedy")
RECENT = 20  # booking.guess's evidence: the program's last runs (GUESS_RUNS)


def held(profile: Sequence[tuple[float, float, int]], t: float) -> int:
    for a, b, v in profile:
        if a - EPS <= t < b - EPS:
            return v
    return 0


def first_pass(jobs: Sequence[Job], caps_mib: Sequence[int], slice_mib: int, extra_mib: float,
               policy: str = "fifo", dt: float = 0.01) -> tuple[float, int, float]:
    """(makespan, kills, seconds of killed runs lost) of a first pass under ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {POLICIES}")
    limit = slice_mib * MIB
    extra = int(extra_mib * MIB)
    profiles = [[(a, b, v + extra) for a, b, v in ramp_profile(j)] for j in jobs]
    caps = [c * MIB for c in caps_mib]
    waiting = list(range(len(jobs)))
    size: dict[int, int] = {}
    adj: dict[int, int] = {}
    running: dict[int, float] = {}  # job -> start
    peaks: list[int] = []  # the program's clean runs, newest last
    durations: list[float] = []
    t, kills, lost, done = 0.0, 0, 0.0, 0
    while done < len(jobs):
        for j, start in sorted(running.items()):
            if t - start >= duration(jobs[j]) - EPS:
                del running[j]
                done += 1
                peaks.append(profiles[j][-1][2])
                durations.append(duration(jobs[j]))
        use = {j: held(profiles[j], t - start) for j, start in running.items()}
        if sum(use.values()) > limit:
            victim = max(running, key=lambda j: (use[j] + adj[j] * limit // 1000, j))
            lost += t - running.pop(victim)
            kills += 1
            size[victim], adj[victim] = caps[victim], 0  # marked: its rerun is booked at its cap
            waiting = sorted([*waiting, victim])  # its old place
            continue  # the same instant again, without it
        room = limit - sum(size[r] + max(0, use[r] - size[r]) for r in running)
        head = None
        sh = None
        for j in list(waiting):
            if j not in size:
                g = guess(caps[j], caps[j], (), "python", peaks[-RECENT:][::-1])
                size[j], adj[j] = (g.size, 1000) if g is not None else (caps[j], 0)
            if head is None and size[j] <= room:
                fits = True
            elif policy == "fifo":
                break
            elif policy == "greedy":
                fits = size[j] <= room
            else:  # easy-program: the program's longest recent run as everyone's duration
                known = max(durations[-RECENT:]) if durations else None
                if head is None:
                    head = j
                    ends = [(size[r], None if known is None else running[r] + estimate(known))
                            for r in running]
                    sh = shadow(size[j], room, ends, t)
                    continue
                assert sh is not None
                how = may_jump(size[j], known, room, sh, t)
                fits = how is not None
                if how == "leftover":
                    sh = sh._replace(extra=sh.extra - size[j])
            if fits:
                running[j] = t
                waiting.remove(j)
                room -= size[j]
        t += dt
    return t, kills, lost
