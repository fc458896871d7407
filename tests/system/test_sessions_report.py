"""What ``hostrun report`` says of agent sessions (``dispatch.local.sessions.sessionties``): a real session
with a job started inside it and one started beside it, on real cgroup v1 memory cgroups. The
session is marked (``role``), its use, cap and booking are there, the job inside names it
(``in_session``), the one beside it does not, and the ``sessions`` summary adds them up against the
sessions slice; the human table says it too. ``hostrun top``'s view of them: tests/fast/test_top.py
(laid out) and tests/system/test_top_screen.py (in a terminal)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

from dispatch.local.sessions.sessionties import is_session, session_at
from tests.conftest import Hostrun, wait_for
from tests.support.agentsessions import SessionWithJob, configure_sessions

MiB = 1 << 20


def _report(hostrun: Hostrun) -> Any:
    done = hostrun.run("report", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["hosts"][0]["report"]


def test_the_report_marks_sessions_and_the_jobs_they_started(hostrun: Hostrun) -> None:
    configure_sessions(hostrun)
    runs = SessionWithJob(hostrun)
    try:
        report = _report(hostrun)
        by_label = {j["label"]: j for j in report["running"]}
        session, inside, outside = by_label["session:agent"], by_label["inside"], by_label["outside"]
        assert session["role"] == "session" and session["in_session"] is None
        assert session["cap"] == 200 * MiB and session["booked"] == 64 * MiB and session["in_use"] > 0
        assert inside["role"] == "job" and inside["in_session"] == session["id"]
        assert outside["role"] == "job" and outside["in_session"] is None
        assert report["sessions"] == {"count": 1, "booked": 64 * MiB, "in_use": session["in_use"],
                                      "jobs": 1, "limit": 300 * MiB}
        table = hostrun.run("report", env={**os.environ, "COLUMNS": "200"})
        assert table.returncode == 0, table.stderr
        assert "1 running, 64 MiB booked" in table.stdout and "1 job in them" in table.stdout
        assert "(sessions slice 300 MiB)" in table.stdout, table.stdout
        rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines()
                if line.count("│") > 3}
        assert "session, 1 job" in rows["session:agent"] and "session:agent" in rows["inside"]
        assert "session" not in rows["outside"].split("│", 2)[2], rows["outside"]
    finally:
        runs.stop()


def test_with_no_session_running_the_figures_are_naught(hostrun: Hostrun) -> None:
    """A plain job running, no session: it is a job in no session, the summary counts nothing, and
    the table says none runs (with the sessions slice's limit) and has no session column."""
    configure_sessions(hostrun)
    job = hostrun.popen("-m", "40M", "-l", "plain", "--", "sleep", "30")
    try:
        wait_for(lambda: any(b[2] == "running" and b[5] for b in hostrun.bookings()), timeout=30)
        report = _report(hostrun)
        [plain] = report["running"]
        assert plain["role"] == "job" and plain["in_session"] is None
        assert report["sessions"] == {"count": 0, "booked": 0, "in_use": 0, "jobs": 0, "limit": 300 * MiB}
        table = hostrun.run("report").stdout
        assert "│ none running (sessions slice 300 MiB)" in table and "session " not in table, table
    finally:
        job.terminate()
        job.wait(timeout=60)


def test_a_session_is_told_by_its_cgroup_and_before_it_has_one_by_its_label() -> None:
    """A row in the sessions slice is a session; a row whose cgroup is a job's is a job, whatever its
    label says (a ledger row written by hand or by an older hostrun); a session admitted but not yet
    in its cgroup is told by its label; a backend that runs no sessions has none."""
    backend: Any = SimpleNamespace(sessions_dir="/cg/hostrun/sessions")
    none: Any = SimpleNamespace(sessions_dir="")
    row: Any = SimpleNamespace(label="session:claude", cgroup="/cg/hostrun/sessions/session-1-2")
    session: Any = SimpleNamespace(path="/cg/hostrun/sessions/session-1-2")
    job: Any = SimpleNamespace(path="/cg/hostrun/job-1-2")
    assert is_session(backend, row, session) and not is_session(backend, row, job)
    waiting_for_its_cgroup: Any = SimpleNamespace(label="session:claude", cgroup=None)
    plain: Any = SimpleNamespace(label="build", cgroup=None)
    assert is_session(backend, waiting_for_its_cgroup, None) and not is_session(backend, plain, None)
    assert not is_session(none, row, session)


def test_a_holders_cgroup_is_matched_to_the_session_it_lies_in() -> None:
    """The path ``/proc/PID/cgroup`` gives is relative to the hierarchy's root (or a cgroup
    namespace's): it matches the session whose directory ends with it, up to the session's name."""
    sessions = {"session-10-5": (7, "/sys/fs/cgroup/memory/user/hostrun/sessions/session-10-5"),
                "session-11-6": (8, "/sys/fs/cgroup/memory/user/hostrun/sessions/session-11-6")}
    assert session_at("/user/hostrun/sessions/session-10-5", sessions) == 7
    assert session_at("/user/hostrun/sessions/session-11-6/tool", sessions) == 8  # below it
    assert session_at("/hostrun/sessions/session-10-5", sessions) == 7  # a namespace's view
    assert session_at("/user/hostrun/job-12-9", sessions) is None
    assert session_at("/elsewhere/session-10-5", sessions) is None  # the same name, not that cgroup
    assert session_at("/", sessions) is None and session_at("", sessions) is None
