"""Requeue after a slice-full kill (``--requeue``, ``requeue_labels``, ``[groups.NAME] requeue``) and
the first-run gamble it allows: a job with no recorded peak is booked below its cap (at a guess,
oom_score_adj 1000), and when the slice fills and the kernel kills it (254), it runs again at its cap,
keeping its place in the queue, instead of failing.

End to end with real cgroup v1 memory cgroups (the kill is the kernel's, in a 300 MiB slice); the
guess itself and the ledger's evidence for it, unit-level on a real SQLite ledger.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dispatch.core.units import MiB
from dispatch.local.admission.booking import MIN_GUESS, Guess, guess, plan_booking
from dispatch.local.admission.ledger import Ledger
from dispatch.local.store.ledgerdb import PeakRecord
from tests.conftest import Hostrun, wait_for

PY = sys.executable
SHOW_ADJ = [PY, "-c", "print(open('/proc/self/oom_score_adj').read().strip())"]


def result(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def queue_log(hostrun: Hostrun) -> str:
    path = hostrun.state_dir / "queue.log"
    return path.read_text() if path.exists() else ""


def history(hostrun: Hostrun, label: str) -> list[dict[str, object]]:
    proc = hostrun.run("history", "--json", "--label", label)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_a_gambler_killed_when_the_slice_fills_runs_again_at_its_cap(hostrun: Hostrun,
                                                                     tmp_path: Path) -> None:
    hostrun.configure(slice="300M")
    # "big" is booked at its 150M cap (adj 0) and holds 130M. "victim" has no recorded peak and may be
    # requeued: booked at half its 250M cap (125M, adj 1000: it fits beside "big"), it takes 200M, the
    # slice overflows and the kernel kills it. Requeued, it is booked at its cap, waits for "big" to
    # end, and succeeds.
    ready, attempts = tmp_path / "big-ready", tmp_path / "attempts"
    big = hostrun.popen("-m", "150M", "--label", "big", "--", PY, "-c",
                        f"import time, pathlib; x = bytearray(130 << 20); "
                        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    out = tmp_path / "victim.json"
    victim = None
    try:
        wait_for(ready.exists, timeout=20)
        victim = hostrun.popen("--requeue", "-m", "250M", "--label", "victim", "--result-file",
                               str(out), "--", PY, "-c",
                               f"open({str(attempts)!r}, 'a').write('run\\n'); "
                               "x = bytearray(200 << 20); "
                               "print(open('/proc/self/oom_score_adj').read().strip())")
        wait_for(lambda: "REQUEUE victim" in queue_log(hostrun), timeout=30)
        # Waiting again, now at its cap, in its old place (the same booking id).
        wait_for(lambda: any(b[1] == "victim" for b in hostrun.bookings()), timeout=30)
        waiting = [b for b in hostrun.bookings() if b[1] == "victim"]
        assert [(b[2], b[4]) for b in waiting] == [("waiting", 250 * MiB)]
        big.terminate()
        big.wait(timeout=30)
        stdout, stderr = victim.communicate(timeout=60)
    finally:
        for proc in (big, victim):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert victim.returncode == 0, stderr
    assert stdout.strip() == "0"  # the second run: booked at its cap, oom_score_adj 0
    assert attempts.read_text() == "run\nrun\n"
    r = result(out)
    assert (r["exit_code"], r["booking_kind"], r["booked_bytes"], r["requeued"]) == (0, "cap", 250 * MiB, 1)
    assert "requeued: victim (booking " in stderr and "booked as gamble 125 MiB" in stderr
    log = queue_log(hostrun)
    gamble = [line for line in log.splitlines() if " GAMBLE victim " in line]
    assert len(gamble) == 1 and "at 125 MiB of its 250 MiB limit: half its cap" in gamble[0]
    (booking_id,) = {line.split("(booking ")[1].split(")")[0]
                     for line in log.splitlines() if "victim (booking" in line}
    assert booking_id == str(waiting[0][0])
    runs = history(hostrun, "victim")
    assert [(h["exit_code"], h["booking_kind"]) for h in runs] == [(254, "gamble"), (0, "cap")]
    assert hostrun.bookings() == []
    # No alert: the kill needed nobody's decision (it was requeued).
    alerts = hostrun.state_dir / "alerts.jsonl"
    assert not alerts.exists() or "victim" not in alerts.read_text()


def test_without_requeue_a_first_run_is_booked_at_its_cap(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(slice="300M")
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "200M", "--result-file", str(out), "--", *SHOW_ADJ)
    assert proc.returncode == 0, proc.stderr
    assert (result(out)["booking_kind"], result(out)["booked_bytes"], proc.stdout.strip()) == (
        "cap", 200 * MiB, "0")
    assert result(out)["requeued"] == 0


def test_requeue_from_the_config_by_label_and_by_group(hostrun: Hostrun, tmp_path: Path) -> None:
    """A group needs no ``max_running`` for ``requeue``. The first run is booked at half its cap;
    the next at the program's recent peak (python's few MiB, so ``MIN_GUESS``)."""
    hostrun.configure(slice="300M", top='requeue_labels = ["test-*"]\n[groups.suite]\nrequeue = true')
    sizes = iter([100 * MiB, MIN_GUESS])
    for args, expect in ((("--label", "test-unit"), "gamble"), (("--group", "suite"), "gamble"),
                         (("--label", "build"), "cap")):
        out = tmp_path / "r.json"
        proc = hostrun.run("-m", "200M", *args, "--result-file", str(out), "--", *SHOW_ADJ)
        assert proc.returncode == 0, proc.stderr
        r = result(out)
        assert r["booking_kind"] == expect, args
        assert proc.stdout.strip() == ("1000" if expect == "gamble" else "0")
        if expect == "gamble":
            assert r["booked_bytes"] == next(sizes)


def test_a_bad_requeue_setting_is_refused(hostrun: Hostrun) -> None:
    hostrun.configure(top='[groups.suite]\nrequeue = [1]')
    proc = hostrun.run("--", "true")
    assert proc.returncode == 2 and "groups.suite.requeue" in proc.stderr, proc.stderr
    hostrun.configure(top='requeue_labels = "test-*"')
    proc = hostrun.run("--", "true")
    assert proc.returncode == 2 and "requeue_labels" in proc.stderr, proc.stderr


def test_the_guess_goes_on_the_programs_recent_peaks(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(slice="300M")
    proc = hostrun.run("--label", "small", "--", PY, "-c", "x = bytearray(40 << 20)")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "r.json"
    proc = hostrun.run("--requeue", "-m", "250M", "--label", "new", "--result-file", str(out), "--",
                       PY, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    r = result(out)
    assert r["booking_kind"] == "gamble"
    booked = r["booked_bytes"]
    assert isinstance(booked, int) and 40 * MiB <= booked < 100 * MiB  # its 40M run, not half the cap
    program = Path(PY).name
    (line,) = [x for x in queue_log(hostrun).splitlines() if " GAMBLE new " in x]
    assert f"the highest peak of the last 1 runs of {program} here" in line


def test_guess_rules() -> None:
    assert guess(400 * MiB, 400 * MiB, [], "make", []) == Guess(200 * MiB, "half its cap: no peak "
                                                                "recorded for it or its program")
    assert guess(None, 1000 * MiB, [], "make", []) is None  # uncapped, nothing known: gamble_size
    # The label elsewhere beats the program; never above the limit; never below MIN_GUESS.
    assert guess(400 * MiB, 400 * MiB, [("farm", 90 * MiB), ("peer", 120 * MiB)], "make",
                 [300 * MiB]) == Guess(120 * MiB, "its recorded peak on peer")
    # The program's runs lower a capped guess, never raise it above half the cap.
    assert guess(400 * MiB, 400 * MiB, [], "make", [300 * MiB, 10 * MiB]) == Guess(200 * MiB,
                                                                                   "half its cap")
    assert guess(400 * MiB, 400 * MiB, [], "make", [150 * MiB]) == Guess(
        150 * MiB, "the highest peak of the last 1 runs of make here")
    assert guess(100 * MiB, 100 * MiB, [("farm", 900 * MiB)], "make", []).size == 100 * MiB  # type: ignore[union-attr]
    assert guess(None, 1000 * MiB, [], "true", [1 * MiB, 2 * MiB]) == Guess(
        MIN_GUESS, "the highest peak of the last 2 runs of true here")


def test_plan_booking_with_a_guess() -> None:
    g = Guess(100 * MiB, "why")
    plan = plan_booking(cap=300 * MiB, peak=None, slice_limit=1000 * MiB, gamble_size=512 * MiB,
                        first_guess=g)
    assert (plan.kind, plan.size, plan.limit, plan.oom_score_adj, plan.why) == (
        "gamble", 100 * MiB, 300 * MiB, 1000, "why")
    # A guess at (or above) the limit is no gamble: booked at the cap as before.
    plan = plan_booking(cap=100 * MiB, peak=None, slice_limit=1000 * MiB, gamble_size=512 * MiB,
                        first_guess=g)
    assert (plan.kind, plan.size, plan.why) == ("cap", 100 * MiB, None)
    # A recorded peak wins over any guess.
    peak = PeakRecord("l", "local", 50 * MiB, 1, 50 * MiB, False, 1.0, 1.0, 0.0)
    plan = plan_booking(cap=300 * MiB, peak=peak, slice_limit=1000 * MiB, gamble_size=512 * MiB,
                        first_guess=g)
    assert (plan.kind, plan.size) == ("peak", 50 * MiB)


def test_guess_evidence_from_a_real_ledger(tmp_path: Path) -> None:
    from dispatch.local.store.ledgerdb import RunRecord

    ledger = Ledger(str(tmp_path), lambda line: None)
    try:
        ledger.record_peak("lbl", "farm", 70 * MiB, False, 3.0, cap=None)
        ledger.record_peak("lbl", "oomed", 900 * MiB, True, 3.0, cap=900 * MiB)  # hit its cap: no evidence
        for i, (command, peak, outcome) in enumerate((("/usr/bin/make -j4", 30, "exit"),
                                                      ("make all", 50, "exit"),
                                                      ("make all", 500, "slice-full"),
                                                      ("cargo build", 800, "exit"))):
            now = time.time()
            ledger.record_run(RunRecord(now, now, 1.0, 0.0, "local", f"l{i}", None, command,
                                        None, "gamble", None, peak * MiB, 0, outcome, False),
                              (90.0, 1000))
        elsewhere, peaks = ledger.guess_evidence("lbl", "local", "make")
        assert elsewhere == [("farm", 70 * MiB)]
        assert peaks == [50 * MiB, 30 * MiB]  # newest first; the killed run says nothing
    finally:
        ledger.close()


def test_a_job_that_exits_254_by_itself_is_not_requeued(hostrun: Hostrun, tmp_path: Path) -> None:
    """Only hostrun's verdict (the kernel's counters said the slice filled) requeues: a job's own
    ``exit 254`` is its status, passed through once."""
    hostrun.configure(slice="300M")
    attempts = tmp_path / "attempts"
    out = tmp_path / "r.json"
    proc = hostrun.run("--requeue", "-m", "100M", "--result-file", str(out), "--", "sh", "-c",
                       f"echo run >> {attempts}; exit 254")
    assert proc.returncode == 254, proc.stderr
    assert attempts.read_text() == "run\n" and "requeued" not in proc.stderr
    assert (result(out)["outcome"], result(out)["requeued"]) == ("exit", 0)


def test_a_job_killed_at_its_cap_booking_each_time_ends_254_after_two_requeues(hostrun: Hostrun,
                                                                               tmp_path: Path) -> None:
    """``MAX_REQUEUES``: the third slice-full kill is the run's exit code. A job booked at its cap is
    only killed when another job undercounted its booking: here "hog" (a 40 MiB gamble) takes 120 MiB
    each time the victim has started an attempt, for 3 s, and the victim, which takes 200 MiB of its
    250 MiB cap, raises its own oom_score_adj to 1000 (as any process may; lowering the hog's needs a
    capability this machine's root lacks), so the kernel takes the victim every time."""
    hostrun.configure(slice="300M", top='gamble_size = "40M"')
    attempts, grown = tmp_path / "attempts", tmp_path / "grown"
    hog = hostrun.popen("--label", "hog", "--", PY, "-c", f"""
import pathlib, time
attempts = pathlib.Path({str(attempts)!r})
for n in (1, 2, 3):
    while not attempts.exists() or len(attempts.read_text().splitlines()) < n:
        time.sleep(0.02)
    x = bytearray(120 << 20)
    pathlib.Path({str(grown)!r} + str(n)).touch()
    time.sleep(3)
    del x
""")
    out = tmp_path / "victim.json"
    try:
        victim = hostrun.run("--requeue", "-m", "250M", "--label", "victim", "--result-file", str(out),
                             "--", PY, "-c", f"""
import pathlib, time
open('/proc/self/oom_score_adj', 'w').write('1000')
with open({str(attempts)!r}, 'a') as fh:
    fh.write('run\\n')
n = len(pathlib.Path({str(attempts)!r}).read_text().splitlines())
while not pathlib.Path({str(grown)!r} + str(n)).exists():
    time.sleep(0.02)
x = bytearray(200 << 20)
""", timeout=120)
        assert hog.wait(timeout=60) == 0, (hog.communicate()[1], victim.stderr)
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
    assert victim.returncode == 254, victim.stderr
    assert attempts.read_text() == "run\n" * 3
    r = result(out)
    assert (r["exit_code"], r["booking_kind"], r["requeued"]) == (254, "cap", 2)
    assert victim.stderr.count("requeued: victim") == 2
    requeues = [line.split(" REQUEUE ")[1] for line in queue_log(hostrun).splitlines() if " REQUEUE " in line]
    assert len(requeues) == 2 and requeues[0].split(":")[0] == requeues[1].split(":")[0], requeues
    assert "(1 of 2)" in requeues[0] and "(2 of 2)" in requeues[1]
    runs = history(hostrun, "victim")
    assert [(h["exit_code"], h["booking_kind"]) for h in runs] == [(254, "gamble"), (254, "cap"),
                                                                     (254, "cap")]
    assert hostrun.bookings() == []
