"""A running agent session placed into the sessions slice at SessionStart (``[sessions] place``;
dispatch/local/sessions/sessionplace.py, dispatch/hooks/placer.py), with real cgroups (v1 here), the real
admission engine and the hook run as Claude Code runs it: ``sh -c "<hook command>"`` from the agent's
process, the recorded SessionStart event on stdin. The agent is a stand-in (a Python process named
``fake-agent`` with a tool child); the real client's tier runs Claude Code itself
(tests/client/test_claude_sessions.py).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.conftest import Hostrun, wait_for
from tests.support.agentsessions import AGENT
from tests.support.claude import event


def _agent(hostrun: Hostrun, tmp_path: Path, *extra: str, job: str = "", ready: str = ""
           ) -> tuple[subprocess.Popen[str], Path, Path]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    hook = shlex.join(hostrun.argv("hook", "session-start"))
    out, go = tmp_path / "where", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, str(script), hook, str(out), str(go), *extra],
                            stdin=subprocess.PIPE, text=True,
                            env={**os.environ, "AGENT_JOB": job, "AGENT_JOB_READY": ready})
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(event("session_start_startup", cwd=str(tmp_path))))
    proc.stdin.close()
    hostrun.started.append(proc)
    return proc, out, go


def _configure(hostrun: Hostrun, extra: str = "", host: str = "") -> None:
    hostrun.configure(slice="1G", host=host, top='[sessions]\nplace = true\ncap = "256M"\n'
                                                 f'first_booking = "64M"\n{extra}')


def test_a_session_started_without_the_wrapper_is_booked_and_moved_in_with_its_tools(
        hostrun: Hostrun, tmp_path: Path) -> None:
    """The hook says the session is being placed; the agent's process and the tool it had already
    started end up in a session cgroup in the sessions slice, booked as ``session:claude``; when
    the agent ends, the booking is released and its peak recorded."""
    _configure(hostrun)
    agent, where, go = _agent(hostrun, tmp_path)
    wait_for(lambda: where.exists() and where.read_text().count("/sessions/session-") == 2, timeout=60)
    told = json.loads((tmp_path / "where.hook").read_text())["hookSpecificOutput"]["additionalContext"]
    assert "booked as an agent session" in told, told
    assert [(b[1], b[2]) for b in hostrun.bookings()] == [("session:claude", "running")]
    go.write_text("end")
    assert agent.wait(timeout=30) == 0
    wait_for(lambda: hostrun.bookings() == [], timeout=30)
    peaks = {p["label"] for p in json.loads(hostrun.run("ledger", "--json").stdout)["peaks"]}
    assert "session:claude" in peaks
    assert "placed in" in (hostrun.state_dir / "sessions.log").read_text()


def test_the_placer_never_moves_itself_into_the_session_it_places(hostrun: Hostrun, tmp_path: Path) -> None:
    """An agent that is a child subreaper gets the detached placer as its child once the hook has
    ended, so the placer is in the agent's process tree: it must not move itself into the session
    (it would then be killed with what the session leaves behind, before it records and releases)."""
    _configure(hostrun)
    agent, where, go = _agent(hostrun, tmp_path, "subreaper")
    wait_for(lambda: where.exists() and where.read_text().count("/sessions/session-") == 2, timeout=60)
    go.write_text("end")
    assert agent.wait(timeout=30) == 0
    wait_for(lambda: hostrun.bookings() == [], timeout=30)
    peaks = {p["label"] for p in json.loads(hostrun.run("ledger", "--json").stdout)["peaks"]}
    assert "session:claude" in peaks, (hostrun.state_dir / "sessions.log").read_text()


def test_a_job_the_agent_already_runs_stays_in_its_own_cgroup(hostrun: Hostrun, tmp_path: Path) -> None:
    """A hostrun job the agent started before its session was placed keeps running under its own
    cap: the placer moves the agent's processes, not those already in a job cgroup of the slice."""
    _configure(hostrun)
    ready = tmp_path / "job-runs"
    job = shlex.join(hostrun.argv("-m", "50M", "-l", "before", "--", "sh", "-c",
                                  f"touch {ready}; exec sleep 300"))
    agent, where, go = _agent(hostrun, tmp_path, job=job, ready=str(ready))
    wait_for(lambda: where.exists() and where.read_text().count("/sessions/session-") == 2, timeout=60)
    (job_dir,) = [d for d in hostrun.job_dirs() if d.name.startswith("job-")]
    assert (job_dir / "cgroup.procs").read_text().split(), "the job's process was moved out"
    go.write_text("end")
    assert agent.wait(timeout=60) == 0


def test_a_placed_session_over_its_cap_is_ended_whole_and_alerted(hostrun: Hostrun, tmp_path: Path) -> None:
    """Placed with a 256 MiB cap, the agent allocates 400 MiB: the whole session is killed, and the
    alert says it was killed at its own cap (250) with the command to resume it."""
    _configure(hostrun)
    agent, where, go = _agent(hostrun, tmp_path)
    wait_for(lambda: where.exists() and where.read_text().count("/sessions/session-") == 2, timeout=60)
    go.write_text("balloon")
    assert agent.wait(timeout=60) != 0
    wait_for(lambda: hostrun.bookings() == [], timeout=30)
    alerts = [json.loads(line) for line in (hostrun.state_dir / "alerts.jsonl").read_text().splitlines()]
    (alert,) = [a for a in alerts if a["label"] == "session:claude"]
    assert alert["kind"] == "own-cap" and alert["exit_code"] == 250, alert
    assert alert["action"].startswith("hostrun session --label claude -m 512M -- "), alert


def test_where_a_session_cannot_be_placed_the_hook_says_so_and_books_nothing(hostrun: Hostrun,
                                                                             tmp_path: Path) -> None:
    _configure(hostrun, host='backend = "none"')
    agent, _, go = _agent(hostrun, tmp_path)
    wait_for((tmp_path / "where.hook").exists, timeout=60)
    told = json.loads((tmp_path / "where.hook").read_text())["hookSpecificOutput"]["additionalContext"]
    assert "runs no agent sessions" in told, told
    go.write_text("end")
    assert agent.wait(timeout=30) == 0
    assert hostrun.bookings() == []
