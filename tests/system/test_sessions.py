"""Agent sessions under the machine's budget (``hostrun session -- CMD``,
dispatch/local/sessions/agentsession.py)
with real runs, real cgroup v1 memory cgroups (the sessions slice inside the test's slice) and the
real admission engine. The "agent" here is a stand-in process tree (``sh`` and ``python3``); the
real client's tier runs Claude Code itself (tests/client/test_claude_client*.py), and the VM runs these on
systemd + cgroup v2.
"""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import pytest

from dispatch.core.exitcodes import ExitCode
from tests.conftest import Hostrun, wait_for

MiB = 1 << 20


def _sessions(hostrun: Hostrun, first: str = "64M", cap: str = "256M", share: str = "0.5",
              slice: str = "600M") -> None:
    hostrun.configure(slice=slice, top=f'[sessions]\nshare = {share}\ncap = "{cap}"\n'
                                      f'first_booking = "{first}"\n')


def _result(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_a_session_runs_in_the_sessions_slice_and_its_jobs_are_booked_beside_it(
        hostrun: Hostrun, tmp_path: Path) -> None:
    """The session's processes are in ``<slice>/sessions/session-<pid>-<start>``, limited to its cap,
    inside a sessions slice of ``share`` of the slice; it is not a job (``HOSTRUN_JOB`` unset), so a
    hostrun it runs is a job of its own, in the slice, booked apart. Its peak is kept under
    ``session:NAME``, and its first run was booked at ``first_booking``."""
    _sessions(hostrun)
    out = tmp_path / "out"
    inner = shlex.join(hostrun.argv("-m", "50M", "--", "sh", "-c", "grep memory /proc/self/cgroup"))
    script = (f"grep memory /proc/self/cgroup > {out}; echo job=${{HOSTRUN_JOB:-none}} >> {out}; "
              f"{inner} >> {out}")
    result = tmp_path / "session.json"
    done = hostrun.run("session", "--label", "agent", "--result-file", str(result), "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    own, job_line, inner_line = out.read_text().splitlines()
    session_cg = own.split(":", 2)[2]
    assert session_cg.startswith(f"{hostrun.cgroup}/sessions/session-"), own
    assert job_line == "job=none"
    assert inner_line.split(":", 2)[2].startswith(f"{hostrun.cgroup}/job-"), inner_line
    outcome = _result(result)
    assert outcome["label"] == "session:agent" and outcome["booking_kind"] == "gamble"
    assert outcome["booked_bytes"] == 64 * MiB and outcome["cap_bytes"] == 256 * MiB
    sessions = hostrun.slice_dir / "sessions"
    assert int((sessions / "memory.limit_in_bytes").read_text()) == 300 * MiB  # 0.5 x 600M
    peaks = hostrun.run("ledger", "--json")
    labels = {p["label"] for p in json.loads(peaks.stdout)["peaks"]}
    assert "session:agent" in labels and any(label.startswith("sh-") for label in labels), labels


def test_a_session_over_its_cap_ends_250_alone_and_says_how_to_resume(hostrun: Hostrun,
                                                                      tmp_path: Path) -> None:
    """A session whose tool process tree balloons past its cap is killed (250) while another session
    and a running job go on to exit 0; the alert names the session and the command that resumes it
    with the cap the half rule gives."""
    _sessions(hostrun)
    other = hostrun.popen("session", "--label", "calm", "-m", "100M", "--", "sleep", "4")
    job = hostrun.popen("-m", "50M", "--", "sleep", "4")
    wait_for(lambda: len(hostrun.job_dirs()) == 2, timeout=30)
    balloon = "python3 -c 'x = bytearray(300 << 20); import time; time.sleep(5)'"
    done = hostrun.run("session", "--label", "greedy", "-m", "100M", "--", "sh", "-c", balloon)
    assert done.returncode == ExitCode.OWN_CAP, done.stderr
    assert other.wait(timeout=60) == 0 and job.wait(timeout=60) == 0
    alerts = [json.loads(line) for line in (hostrun.state_dir / "alerts.jsonl").read_text().splitlines()]
    (alert,) = [a for a in alerts if a["label"] == "session:greedy"]
    assert alert["kind"] == "own-cap" and alert["exit_code"] == 250
    assert alert["action"].startswith("hostrun session --label greedy -m 512M -- sh -c "), alert
    assert "its jobs and the other sessions went on" in alert["message"]


def test_a_tool_killed_at_the_sessions_cap_ends_the_whole_session(hostrun: Hostrun) -> None:
    """cgroup v1 kills only the largest process at the cap (the tool); the agent (here ``sh``, going
    on to sleep a minute) would live on without it: hostrun ends the whole session, 250, as v2's
    ``memory.oom.group`` does. Were it not ended, this run would outlast its timeout."""
    _sessions(hostrun)
    agent = "python3 -c 'x = bytearray(300 << 20)'; sleep 60"
    done = hostrun.run("session", "--label", "tool", "-m", "100M", "--", "sh", "-c", agent, timeout=45)
    assert done.returncode == ExitCode.OWN_CAP, done.stderr


def test_a_session_ended_takes_the_jobs_it_started_with_it(hostrun: Hostrun, tmp_path: Path) -> None:
    """The holders and guardians of the jobs a session started run in the session's cgroup, so
    ending the session kills them; their jobs must not run on unbooked: the engine ends a running
    booking's job when its holder died (the leak check then finds nothing)."""
    _sessions(hostrun)
    inner = shlex.join(hostrun.argv("-m", "50M", "-l", "inner", "--", "sleep", "120"))
    session = hostrun.popen("session", "--label", "ending", "--", "sh", "-c", f"{inner} & sleep 120")
    wait_for(lambda: [d for d in hostrun.job_dirs() if d.name.startswith("job-")], timeout=30)
    session.send_signal(signal.SIGTERM)
    assert session.wait(timeout=60) == 128 + signal.SIGTERM
    wait_for(lambda: hostrun.bookings() == [] and hostrun.job_dirs() == [], timeout=30)


def test_sessions_that_would_overfill_the_slice_wait_their_turn(hostrun: Hostrun, tmp_path: Path) -> None:
    """Booked at 250 MiB each in a 600 MiB slice, two sessions start and the third waits (saying so)
    until one ends: never three at once."""
    _sessions(hostrun, first="250M", cap="280M", share="1")
    stamps = [tmp_path / f"s{i}" for i in range(3)]
    procs = []
    for i, stamp in enumerate(stamps):
        procs.append(hostrun.popen("session", "--label", f"s{i}", "--", "sh", "-c",
                                   f"date +%s.%N > {stamp}; sleep 2; date +%s.%N >> {stamp}"))
        if i < 2:
            wait_for(stamp.exists, timeout=30)
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert "waiting" in outs[2][1], outs[2][1]
    spans = [tuple(float(x) for x in s.read_text().split()) for s in stamps]
    third_start = spans[2][0]
    assert third_start >= min(spans[0][1], spans[1][1]) - 0.05, spans  # after one of them ended


def test_sessions_wait_for_room_in_their_own_slice_while_jobs_pass(hostrun: Hostrun, tmp_path: Path) -> None:
    """The sessions slice holds 300 MiB of the 600 MiB slice: a second session of 200 MiB waits
    (saying the sessions slice is what holds it) though the slice has room, and a job behind it
    starts meanwhile: a session held by its own slice reserves nothing in the queue."""
    _sessions(hostrun, first="200M", cap="250M", share="0.5")
    first_stamp, job_stamp = tmp_path / "first", tmp_path / "job"
    first = hostrun.popen("session", "--label", "a", "--", "sh", "-c",
                          f"touch {first_stamp}; while [ ! -e {job_stamp} ]; do sleep 0.1; done; sleep 1")
    wait_for(first_stamp.exists, timeout=30)
    second = hostrun.popen("session", "--label", "b", "--", "true")
    assert second.stderr is not None
    line = second.stderr.readline()
    while "waiting" not in line and line:
        line = second.stderr.readline()
    assert "sessions slice 200 MiB of 300 MiB booked by 1 session" in line, line
    job = hostrun.run("-m", "200M", "--", "touch", str(job_stamp))  # passes the waiting session
    assert job.returncode == 0, job.stderr
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0


def test_the_cap_comes_from_the_recorded_peak_by_the_half_rule(hostrun: Hostrun, tmp_path: Path) -> None:
    """With no ``-m``: ``[sessions] cap`` at first, then 2 x the worst recorded peak in 512 MiB steps
    (held to the sessions slice), said in one line."""
    _sessions(hostrun, cap="200M", slice="2G")
    first = hostrun.run("session", "--label", "grow", "--", "python3", "-c", "x = bytearray(40 << 20)")
    assert first.returncode == 0, first.stderr
    assert "cap 200 MiB ([sessions] cap: no peak recorded yet)" in first.stderr
    second = hostrun.run("session", "--label", "grow", "--", "true")
    assert second.returncode == 0, second.stderr
    assert "cap 512 MiB (2 x its worst recorded peak" in second.stderr, second.stderr


def test_bad_session_requests_get_one_line_and_nothing_runs(hostrun: Hostrun, tmp_path: Path) -> None:
    """A cap larger than the sessions slice: 243; no command: 2; a session inside a job: 2; a
    first booking above the cap in the file: 2. Nothing is left booked."""
    _sessions(hostrun)
    big = hostrun.run("session", "-m", "400M", "--", "true")
    assert big.returncode == ExitCode.NEVER_FITS, big.stderr
    assert "larger than the sessions slice (300 MiB" in big.stderr and big.stderr.count("\n") == 1
    assert hostrun.run("session").returncode == ExitCode.USAGE
    job = hostrun.run("-l", "session:x", "--", "true")  # a session's label is not a job's
    assert job.returncode == ExitCode.USAGE and "hostrun session --label NAME" in job.stderr
    nested = hostrun.run("-m", "50M", "--", *hostrun.argv("session", "--", "true"))
    assert nested.returncode == ExitCode.USAGE and "inside a hostrun job" in nested.stderr
    hostrun.configure(top='[sessions]\ncap = "100M"\nfirst_booking = "200M"\n')
    bad = hostrun.run("session", "--", "true")
    assert bad.returncode == ExitCode.USAGE and "larger than cap" in bad.stderr, bad.stderr
    assert hostrun.bookings() == []


def test_a_backend_that_runs_no_sessions_refuses_with_78(hostrun: Hostrun) -> None:
    """``backend = "none"`` caps nothing, so it cannot hold a session: 78, one line, nothing run."""
    hostrun.configure(host='backend = "none"')
    done = hostrun.run("session", "--", "true")
    assert done.returncode == ExitCode.NOT_RUN, done.stderr
    assert "runs no agent sessions" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize(("argv", "resumed", "known"), [
    (["claude"], ["claude", "--continue"], True),
    (["/usr/bin/claude", "-c", "--model", "haiku"],
     ["/usr/bin/claude", "--continue", "--model", "haiku"], True),
    (["claude", "--resume", "abc"], ["claude", "--resume", "abc"], True),
    (["aider", "--yes"], ["aider", "--yes"], False),
])
def test_the_resume_command_of_a_killed_session(argv: list[str], resumed: list[str], known: bool) -> None:
    from dispatch.local.alertlog import resume_argv

    assert resume_argv(argv) == (resumed, known)

