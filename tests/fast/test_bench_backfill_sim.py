"""The scheduling simulator behind bench_backfill.py's simulated rows (bench/_packsim.py), on cases
small enough to work out by hand: if it is wrong, the references it prints mislead whoever reads the
bench's table. Pure computation, no real jobs."""

from __future__ import annotations

import importlib.util
import os
import random
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sim = _load("_packsim")
CAP = 600 * sim.MIB


def whole(jobs):  # type: ignore[no-untyped-def]
    return [sim.whole_profile(j) for j in jobs]


def test_two_jobs_that_fit_together_run_together() -> None:
    jobs = [(200, 0.0, 2.0), (300, 0.0, 3.0)]
    makespan, starts = sim.list_schedule(whole(jobs), [0, 1], CAP, strict=True)
    assert (makespan, starts) == (3.0, {0: 0.0, 1: 0.0})
    assert sim.easy_schedule(jobs, [0, 1], CAP, lambda d: d)[0] == 3.0


def test_two_jobs_that_do_not_fit_together_run_in_series() -> None:
    jobs = [(400, 0.0, 2.0), (300, 0.0, 3.0)]
    makespan, starts = sim.list_schedule(whole(jobs), [0, 1], CAP)
    assert (makespan, starts) == (5.0, {0: 0.0, 1: 2.0})
    assert sim.easy_schedule(jobs, [0, 1], CAP, lambda d: d)[0] == 5.0


def test_backfill_starts_a_short_job_beside_the_heads_wait() -> None:
    # A (350 MiB, 4 s) runs; the head B (400 MiB) waits for A's end at 4 s (its shadow); C (250 MiB,
    # 3 s) fits beside A now and ends by 4 s: EASY starts it at once, strict FIFO only at 4 s.
    jobs = [(350, 0.0, 4.0), (400, 0.0, 2.0), (250, 0.0, 3.0)]
    makespan, starts = sim.easy_schedule(jobs, [0, 1, 2], CAP, lambda d: d)
    assert (makespan, starts) == (6.0, {0: 0.0, 2: 0.0, 1: 4.0})
    fifo, fifo_starts = sim.list_schedule(whole(jobs), [0, 1, 2], CAP, strict=True)
    assert (fifo, fifo_starts) == (9.0, {0: 0.0, 1: 4.0, 2: 6.0})


def test_backfill_never_delays_the_head_where_list_scheduling_does() -> None:
    # D (250 MiB, 5 s) fits beside A now but would outlast the head's shadow (4 s) and not fit
    # beside it: EASY holds it (head at 4 s, D after the head at 6 s); greedy list scheduling starts
    # it and the head waits for D's end at 5 s.
    jobs = [(350, 0.0, 4.0), (400, 0.0, 2.0), (250, 0.0, 5.0)]
    assert sim.easy_schedule(jobs, [0, 1, 2], CAP, lambda d: d) == (11.0, {0: 0.0, 1: 4.0, 2: 6.0})
    assert sim.list_schedule(whole(jobs), [0, 1, 2], CAP) == (7.0, {0: 0.0, 2: 0.0, 1: 5.0})


def test_ramp_profiles_overlap_while_one_has_not_grown() -> None:
    # A holds 400 MiB for 6 s. B ramps to 400 MiB in 8 steps of 50 MiB, one a second, then holds it
    # 1 s: beside A it may only reach 200 MiB (4 steps), so its 5th step (at start + 4 s) must come
    # at or after A's end: B starts at 2 s, an instant that is no job's end, and ends at 11 s.
    a, b = (400, 0.0, 6.0), (400, 8.0, 1.0)
    profiles = [sim.ramp_profile(a), sim.ramp_profile(b)]
    assert sim.list_schedule(profiles, [0, 1], CAP) == (11.0, {0: 0.0, 1: 2.0})
    # booked at whole peaks they run in series
    assert sim.list_schedule(whole([a, b]), [0, 1], CAP) == (15.0, {0: 0.0, 1: 6.0})
    # A ending at 4 s: B's 5th step begins exactly as A ends, so both start at 0
    assert sim.list_schedule([sim.ramp_profile((400, 0.0, 4.0)), profiles[1]], [0, 1], CAP) == (
        9.0, {0: 0.0, 1: 0.0})
    # the other way round: B (ramping, started first) is at 200 MiB until 4 s, so a 400 MiB job of
    # 4 s fits beside it from 0 s, ending exactly as B's 5th step begins
    assert sim.list_schedule([profiles[1], sim.ramp_profile((400, 0.0, 4.0))], [0, 1], CAP) == (
        9.0, {0: 0.0, 1: 0.0})


def test_ramp_profile_is_job_pys_steps() -> None:
    steps = sim.ramp_profile((400, 2.0, 1.0))
    assert [round(a, 6) for a, _, _ in steps] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    assert [v // sim.MIB for _, _, v in steps] == [50, 100, 150, 200, 250, 300, 350, 400, 400]
    assert steps[-1][1] == 3.0


def test_packing_bound_sees_jobs_that_never_run_together() -> None:
    # three 400 MiB jobs of 2 s on 600 MiB: the fluid bound says 4 s, no two fit together: 6 s
    jobs = [(400, 0.0, 2.0)] * 3
    assert sim.packing_bound(jobs, 600)[0] == pytest.approx(6.0)
    assert sim.list_schedule(whole(jobs), [0, 1, 2], CAP)[0] == 6.0


def test_simulated_rows_bracketed_by_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(BENCH)  # for bench_backfill's own imports (_common)
    jobs = _load("bench_backfill").job_mix(20, 13)  # the bench's own mix
    rows, _ = sim.simulate(jobs, 600, 13, 0, 3.5)
    by = {name: makespan for name, makespan, _ in rows}
    offline = by["offline, peaks known, whole duration (simulated)"]
    assert offline >= sim.packing_bound(jobs, 600)[0] - 1e-9
    assert offline <= by["hostrun fifo, zero overhead (simulated)"]
    assert offline <= by["hostrun backfill, estimate = duration, zero overhead (simulated)"]
    ramp = by["offline, ramp profiles known, time-to-peak packing (simulated)"]
    assert ramp >= sim.ramp_area_bound(jobs, 600) - 1e-9
    assert sim.orders(jobs, 3, 13) == sim.orders(jobs, 3, 13)


def test_easy_scan_is_hostruns_decide() -> None:
    """The simulated EASY scan admits exactly whom hostrun's own ``backfill.decide`` admits, on
    random queues and running sets (hostrun's estimates), so its rows say what hostrun's policy does."""
    from dispatch.local.admission import backfill
    from dispatch.local.store.ledgerdb import Booking

    rng = random.Random(5)
    now = 100.0
    checked = jumped = 0
    for _ in range(300):
        n = rng.randint(2, 9)
        jobs = [(rng.choice([50, 100, 150, 200, 250, 300, 350, 400]), 0.0, round(rng.uniform(1, 6), 1))
                for _ in range(n)]
        size = [p * sim.MIB for p, _, _ in jobs]
        est = [sim.hostrun_estimate(sim.duration(j)) for j in jobs]
        order = list(range(n))
        rng.shuffle(order)
        running: list[int] = []
        for j in order:
            if rng.random() < 0.5 and sum(size[r] for r in running) + size[j] <= CAP:
                running.append(j)
        starts = {r: now - rng.uniform(0, sim.duration(jobs[r]) - 0.01) for r in running}
        waiting = [j for j in order if j not in running]
        book = {j: Booking(j, "local", f"job{j}", "running" if j in starts else "waiting", 0, 0,
                           size[j], size[j], "peak", None, "", None, 0.0, starts.get(j), None)
                for j in range(n)}
        durations = {f"job{j}": sim.duration(jobs[j]) for j in range(n)}
        free = CAP - sum(size[r] for r in running)
        for i, me in enumerate(waiting):
            theirs = backfill.decide(book[me], [book[b] for b in waiting[:i]],
                                     [book[r] for r in running], free, durations, now)
            ours = sim._easy_admits(me, waiting[:i], running, starts, size, est, CAP, now)
            assert ours == theirs.admit, (jobs, running, starts, waiting, me)
            checked += 1
            jumped += theirs.admit and theirs.how is not None
    assert checked > 500 and jumped > 20  # the jump rules were exercised, not only plain fits


firstpass = _load("_firstpass")


def test_first_pass_a_gambler_that_outgrows_the_slice_is_killed_and_rerun_at_its_cap() -> None:
    """Both booked at half their 600 MiB caps (300 + 300 fit a 600 MiB slice); A ramps by 50 MiB every
    0.125 s beside B's 300 MiB, so at its 7th step (350 MiB, t = 0.75 s) the slice overflows and the
    kernel takes A (the larger gambler). Requeued at its cap, A waits for B's end (2 s) and runs its
    2 s: makespan 4 s, 0.75 s of A's first run lost."""
    jobs = [(400, 1.0, 1.0), (300, 0.0, 2.0)]
    makespan, kills, lost = firstpass.first_pass(jobs, [600, 600], 600, 0.0, "fifo")
    assert kills == 1
    assert makespan == pytest.approx(4.0, abs=0.03) and lost == pytest.approx(0.75, abs=0.03)


def test_first_pass_rules_differ_only_where_the_head_is_blocked() -> None:
    """Slice 400 MiB: X (200 MiB, booked at half its 400 MiB cap) runs 2 s; H, booked at half of 600,
    does not fit beside it; Y (a 50 MiB guess) could. fifo and easy-program (no run has ended, so no
    duration is known) keep Y behind H: X 0-2, H 2-3, Y 2-5. greedy starts Y at once: done at 3 s."""
    jobs = [(200, 0.0, 2.0), (300, 0.0, 1.0), (50, 0.0, 3.0)]
    caps = [400, 600, 100]
    results = {p: firstpass.first_pass(jobs, caps, 400, 0.0, p) for p in firstpass.POLICIES}
    assert results["fifo"][0] == pytest.approx(5.0, abs=0.03)
    assert results["easy-program"][0] == pytest.approx(5.0, abs=0.03)
    assert results["greedy"][0] == pytest.approx(3.0, abs=0.03)
    assert all(kills == 0 for _, kills, _ in results.values())
    with pytest.raises(ValueError, match="policy"):
        firstpass.first_pass(jobs, caps, 400, 0.0, "lifo")
