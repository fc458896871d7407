"""Offline references for ``bench_backfill.py``: what a scheduler could reach on the same job mix, by
event-driven simulation with zero overheads (no hand-off, no interpreter start, no sampling).
Standard library only (and hostrun's own shadow rule); deterministic.

Why: the bench's lower bound, max(sum(peak x duration) / slice, longest job), is fluid: it lets any
amount of memory be used, so it ignores that peaks of 50-400 MiB on 600 MiB leave gaps no scheduler
can fill (two 350 MiB jobs never run together). Measured against it alone, hostrun's ratio mixes
three things: those gaps, its policy, and its overheads. The simulated rows (``simulate``) split them:

* offline, whole peaks: the best makespan found by a scheduler that books each job at its whole peak
  for its whole duration and knows every peak and duration in advance: list scheduling
  (``best_list_schedule``) over several job orders (longest / largest-area / largest-peak first,
  submission order, seeded random orders), FIFO and EASY backfill in submission order, the best
  kept (again, list scheduling alone, at the peaks hostrun records: nominal + ``extra_mib``). A
  heuristic, so an upper bound on the optimum; ``packing_bound`` brackets it from below.
* offline, ramp profiles: the same list scheduling with each job booked at its ramp profile (memory
  over time: ``job.py``'s PEAK in 8 equal steps over RAMP, then held), so a job may start beside
  others when at every future instant the profiles sum within the slice: perfect time-to-peak
  packing. Its memory-time is smaller than the bench's bound assumes, so it may beat that bound.
* hostrun's own policies with zero overhead: strict FIFO (``list_schedule``, ``strict``) and EASY
  backfill (``easy_schedule``: ``backfill.decide``'s scan with hostrun's ``shadow``), so the real
  makespan's excess over them is overhead, not policy.

A profile is a list of steps (from, to, bytes), times in seconds after the job's start. Times are
floats compared with ``EPS``; memory is whole bytes, so the slice's arithmetic is exact.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from dispatch.local.admission.backfill import INF, estimate, shadow

MIB = 1 << 20
EPS = 1e-9
# the rows closest to hostrun's real series (bench_backfill prints the real ones' excess over them)
BOOKED_FIFO = "hostrun fifo, peaks + {extra:g} MiB, zero overhead (simulated)"
BOOKED_BACKFILL = "hostrun backfill, estimate x 1.25 + 1 s, peaks + {extra:g} MiB, zero overhead (simulated)"
Job = tuple[int, float, float]  # (peak MiB, ramp s, hold s), as bench_backfill.job_mix
Step = tuple[float, float, int]  # (from, to) seconds after the job's start, bytes held


def duration(job: Job) -> float:
    return job[1] + job[2]


def whole_profile(job: Job, extra_mib: float = 0.0) -> list[Step]:
    """The job booked at its whole peak (plus ``extra_mib``: what hostrun records beyond the nominal
    peak, the interpreter's own pages) for its whole run."""
    return [(0.0, duration(job), int((job[0] + extra_mib) * MIB))]


def ramp_profile(job: Job) -> list[Step]:
    """What ``job.py PEAK RAMP HOLD`` holds over time: ``PEAK MiB // 8`` more at each of 8 steps, one
    every RAMP/8 s from its start, then all of it for HOLD s."""
    peak, ramp, hold = job
    chunk = peak * MIB // 8
    steps = [(k * ramp / 8, (k + 1) * ramp / 8, (k + 1) * chunk) for k in range(8)]
    steps.append((ramp, ramp + hold, 8 * chunk))
    return [s for s in steps if s[1] - s[0] > EPS]


def usage(placed: Sequence[Step], now: float) -> list[Step]:
    """The slice's use from ``now`` on, as segments (from, to, bytes) with bytes > 0, from the steps
    ``placed`` (absolute times) of the jobs started so far."""
    delta: dict[float, int] = {}
    for a, b, v in placed:
        if b > now + EPS:
            delta[a] = delta.get(a, 0) + v
            delta[b] = delta.get(b, 0) - v
    segments: list[Step] = []
    level = 0
    points = sorted(delta)
    for a, b in zip(points, points[1:]):
        level += delta[a]
        if level > 0 and b - a > EPS:
            segments.append((a, b, level))
    return segments


def earliest_start(profile: Sequence[Step], used: Sequence[Step], now: float, cap: int) -> float:
    """The first time >= ``now`` at which ``profile`` fits beside ``used`` at every instant of its
    run. A step (a, b, v) started at s clashes with a segment (u0, u1, w) where w + v > cap for every
    s in the open interval (u0 - b, u1 - a); the answer is the first s outside all of them."""
    if any(v > cap for _, _, v in profile):
        raise ValueError("a job larger than the slice never fits")
    clashes = sorted((u0 - b, u1 - a) for a, b, v in profile for u0, u1, w in used if w + v > cap)
    s = now
    for lo, hi in clashes:  # by start: once one starts after s, none later can hold s
        if lo + EPS < s < hi - EPS:
            s = hi
    return s


def list_schedule(profiles: Sequence[Sequence[Step]], order: Sequence[int], cap: int,
                  strict: bool = False) -> tuple[float, dict[int, float]]:
    """List scheduling: at every event, scan ``order`` and start each waiting job that fits now
    (``strict``: stop at the first that does not, i.e. FIFO). (makespan, start per job)."""
    placed: list[Step] = []
    starts: dict[int, float] = {}
    waiting = list(order)
    now = 0.0
    while waiting:
        used = usage(placed, now)
        nxt = INF
        for j in list(waiting):
            s = earliest_start(profiles[j], used, now, cap)
            if s <= now + EPS:
                starts[j] = now
                placed += [(now + a, now + b, v) for a, b, v in profiles[j]]
                used = usage(placed, now)
                waiting.remove(j)
            else:
                nxt = min(nxt, s)  # later starts in this scan only push it later: a safe next event
                if strict:
                    break
        now = nxt
    return _makespan(profiles, starts), starts


def easy_schedule(jobs: Sequence[Job], order: Sequence[int], cap: int,
                  estimate: Callable[[float], float], extra_mib: float = 0.0
                  ) -> tuple[float, dict[int, float]]:
    """hostrun's EASY backfill (``dispatch.local.admission.backfill.decide``) on whole-peak bookings, each
    job's estimate ``estimate(duration)``: at every job end, each waiter in queue order is admitted when it
    fits ahead of the first blocked one (the head), or jumps it by ending by the head's shadow or
    fitting in the room left at the shadow. (makespan, start per job)."""
    size = [whole_profile(j, extra_mib)[0][2] for j in jobs]
    est = [estimate(duration(j)) for j in jobs]
    starts: dict[int, float] = {}
    running: list[int] = []
    waiting = list(order)
    now = 0.0
    while waiting:
        running = [r for r in running if starts[r] + duration(jobs[r]) > now + EPS]
        admitted = True
        while admitted:  # each admission changes the room: every waiter decides again, in order
            admitted = False
            for i, j in enumerate(waiting):
                if _easy_admits(j, waiting[:i], running, starts, size, est, cap, now):
                    starts[j] = now
                    running.append(j)
                    waiting.pop(i)
                    admitted = True
                    break
        if waiting:
            now = min(starts[r] + duration(jobs[r]) for r in running)
    profiles = [whole_profile(j) for j in jobs]
    return _makespan(profiles, starts), starts


def _easy_admits(me: int, earlier: Sequence[int], running: Sequence[int], starts: dict[int, float],
                 size: Sequence[int], est: Sequence[float], cap: int, now: float) -> bool:
    """``backfill.decide``'s scan for ``me`` with the estimates ``est`` (hostrun's own uses its
    ``estimate``: the recorded duration x 1.25 + 1 s)."""
    room = cap - sum(size[r] for r in running)
    ends: list[tuple[int, float | None]] = []
    for r in running:
        end = starts[r] + est[r]
        ends.append((size[r], end if end > now else None))
    sh = None
    for b in [*earlier, me]:
        if sh is None:
            if size[b] <= room:
                if b == me:
                    return True
                room -= size[b]
                ends.append((size[b], now + est[b]))
                continue
            if b == me:
                return False
            sh = shadow(size[b], room, ends, now)
            continue
        fits = size[b] <= room
        ends_first = now + est[b] <= sh.at
        leftover = size[b] <= sh.extra
        if b == me:
            return fits and (ends_first or leftover)
        if fits and (ends_first or leftover):
            room -= size[b]
            if not ends_first:
                sh = sh._replace(extra=sh.extra - size[b])
    raise AssertionError("unreachable: me is last")


def _makespan(profiles: Sequence[Sequence[Step]], starts: dict[int, float]) -> float:
    return max((starts[j] + max(b for _, b, _ in profiles[j]) for j in starts), default=0.0)


def orders(jobs: Sequence[Job], randoms: int, seed: int) -> list[tuple[str, list[int]]]:
    """The job orders tried: submission, longest first, largest area (peak x duration) first,
    largest peak first (ties: longest first), and ``randoms`` shuffles drawn from ``seed``."""
    n = range(len(jobs))
    named = [("submission order", list(n)),
             ("longest first", sorted(n, key=lambda j: -duration(jobs[j]))),
             ("largest area first", sorted(n, key=lambda j: -jobs[j][0] * duration(jobs[j]))),
             ("largest peak first", sorted(n, key=lambda j: (-jobs[j][0], -duration(jobs[j]))))]
    rng = random.Random(seed * 1009 + 17)
    for k in range(randoms):
        shuffled = list(n)
        rng.shuffle(shuffled)
        named.append((f"random order {k}", shuffled))
    return named


def best_list_schedule(profiles: Sequence[Sequence[Step]], tries: Sequence[tuple[str, list[int]]],
                       cap: int) -> tuple[float, str]:
    """The shortest list schedule over ``tries``: (makespan, the order's name); the first wins a tie."""
    best = (INF, "")
    for name, order in tries:
        makespan = list_schedule(profiles, order, cap)[0]
        if makespan < best[0] - EPS:
            best = (makespan, name)
    return best


def packing_bound(jobs: Sequence[Job], slice_mib: int) -> tuple[float, str]:
    """A lower bound on any schedule that books whole peaks, tighter than the fluid one: at every
    instant the running peaks sum to at most the slice, so for any weight f with sum f(p) <= 1
    whenever sum p <= slice (a dual-feasible function of bin packing), the makespan is at least
    sum(f(peak) x duration). Tried: f(p) = p / slice (the fluid bound); Fekete and Schepers' u_k
    (p / slice where (k+1)p / slice is whole, else floor((k+1)p / slice) / k), k = 1..20; and
    "1 above slice - e, 0 below e, p / slice between" for every e up to half the slice.
    (bound, which weight); the longest job too."""
    best = (max(duration(j) for j in jobs), "longest job")

    def consider(total: float, name: str) -> None:
        nonlocal best
        if total > best[0] + EPS:
            best = (total, name)

    s = slice_mib
    consider(sum(p * duration(j) for j in jobs for p in [j[0]]) / s, "fluid")
    for k in range(1, 21):
        consider(sum((p / s if (k + 1) * p % s == 0 else ((k + 1) * p // s) / k) * duration(j)
                     for j in jobs for p in [j[0]]), f"u_{k}")
    for e in range(1, s // 2 + 1):
        consider(sum((1.0 if p > s - e else 0.0 if p < e else p / s) * duration(j)
                     for j in jobs for p in [j[0]]), f"big items above {s - e} MiB")
    return best


def ramp_area_bound(jobs: Sequence[Job], slice_mib: int) -> float:
    """max(sum of the ramp profiles' areas / slice, longest job): the fluid bound of time-to-peak
    packing (a job holds on average 9/16 of its peak while it ramps), below the bench's bound."""
    area = sum((b - a) * v for j in jobs for a, b, v in ramp_profile(j))
    return max(area / (slice_mib * MIB), max(duration(j) for j in jobs))


def hostrun_estimate(d: float) -> float:
    """hostrun's estimate of a run whose recorded duration is ``d`` (``backfill.estimate``)."""
    return estimate(d)


def simulate(jobs: Sequence[Job], slice_mib: int, seed: int, randoms: int, extra_mib: float
             ) -> tuple[list[tuple[str, float, str]], list[str]]:
    """The simulated rows for one job mix, (series, makespan, notes), and lines of notes (the bounds
    below the bench's). ``randoms``: random job orders tried by the offline references; ``extra_mib``:
    what hostrun's recorded peak adds to each nominal peak."""
    cap = slice_mib * MIB
    tries = orders(jobs, randoms, seed)
    whole = [whole_profile(j) for j in jobs]
    submitted = list(range(len(jobs)))
    fifo = list_schedule(whole, submitted, cap, strict=True)[0]
    easy = easy_schedule(jobs, submitted, cap, lambda d: d)[0]
    greedy, how = best_list_schedule(whole, tries, cap)
    candidates = [(greedy, f"list scheduling, {how}"), (easy, "EASY backfill, submission order"),
                  (fifo, "FIFO, submission order")]
    best, best_how = min(candidates, key=lambda c: round(c[0], 6))  # the first on a tie
    recorded, recorded_how = best_list_schedule([whole_profile(j, extra_mib) for j in jobs], tries, cap)
    ramp, ramp_how = best_list_schedule([ramp_profile(j) for j in jobs], tries, cap)
    margin = easy_schedule(jobs, submitted, cap, hostrun_estimate)[0]
    booked_fifo = list_schedule([whole_profile(j, extra_mib) for j in jobs], submitted, cap,
                                strict=True)[0]
    booked = easy_schedule(jobs, submitted, cap, hostrun_estimate, extra_mib)[0]
    n = f"best of {len(tries) + 2} schedules"
    rows = [
        ("offline, peaks known, whole duration (simulated)", best, f"{n}: {best_how}"),
        (f"offline, peaks + {extra_mib:g} MiB known, whole duration (simulated)", recorded,
         f"booked as hostrun records; best of {len(tries)} orders: {recorded_how}"),
        ("offline, ramp profiles known, time-to-peak packing (simulated)", ramp,
         f"best of {len(tries)} orders: {ramp_how}"),
        ("hostrun fifo, zero overhead (simulated)", fifo, "booked at nominal peaks"),
        ("hostrun backfill, estimate = duration, zero overhead (simulated)", easy,
         "booked at nominal peaks"),
        ("hostrun backfill, estimate = duration x 1.25 + 1 s, zero overhead (simulated)", margin,
         "hostrun's margin"),
        (BOOKED_FIFO.format(extra=extra_mib), booked_fifo,
         "booked as recorded (the interpreter's own pages)"),
        (BOOKED_BACKFILL.format(extra=extra_mib), booked, "hostrun's margin, booked as recorded"),
    ]
    bound, weight = packing_bound(jobs, slice_mib)
    notes = [f"whole-peak lower bound (bin-packing weights, best: {weight}): {bound:.2f} s",
             f"ramp-profile fluid bound (sum of profile areas / slice): "
             f"{ramp_area_bound(jobs, slice_mib):.2f} s"]
    return rows, notes
