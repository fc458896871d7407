"""Agent sessions (``hostrun session``) on a real systemd with cgroup v2, in the test VM, as root (the
system manager) and as a normal user (their own user manager): the session's scope in the sessions
slice (a child of the slice unit) with its cap and high mark, the jobs it starts in scopes of the
slice, and a session that balloons past its cap ending 250 alone. The "agent" is a stand-in process
tree (``sh``, ``python3``); the real client's tier runs Claude Code itself.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from dispatch.core.units import MiB

SESSIONS = '[sessions]\nshare = 0.6\ncap = "120M"\nfirst_booking = "40M"\n'


@pytest.mark.parametrize("user", ["root", "dev"])
def test_a_session_gets_its_scope_in_the_sessions_slice_and_its_jobs_their_own(guest: Any,
                                                                               user: str) -> None:
    g = guest(user, extra=SESSIONS)
    sessions_unit = g.slice_unit[: -len(".slice")] + "-sessions.slice"
    inner = g.hostrun_cmd("-m", "30M", "--", "sh", "-c", "sed -n 's/^0:://p' /proc/self/cgroup")
    script = ("sed -n 's/^0:://p' /proc/self/cgroup; "
              f"u=$(basename $(sed -n 's/^0:://p' /proc/self/cgroup)); "
              f"{g.systemctl} show -p MemoryMax -p MemoryHigh -p Slice $u; {inner}")
    done = g.run("session", "--label", "agent", "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"/{g.slice_unit}/{sessions_unit}/hostrun-session-" in lines[0], lines
    assert f"MemoryMax={120 * MiB}" in lines and f"MemoryHigh={int(120 * MiB * 0.9) // 4096 * 4096}" in lines
    assert f"Slice={sessions_unit}" in lines
    assert f"/{g.slice_unit}/hostrun-job-" in lines[-1], lines
    limit = g.sh(f"cat {g.slice_dir()}/{sessions_unit}/memory.max").stdout.strip()
    assert int(limit) == int(300 * MiB * 0.6) // 4096 * 4096


@pytest.mark.parametrize("user", ["root", "dev"])
def test_a_session_past_its_cap_ends_250_while_another_session_and_a_job_go_on(guest: Any,
                                                                               user: str) -> None:
    g = guest(user, extra=SESSIONS)
    calm = g.hostrun_cmd("session", "--label", "calm", "-m", "60M", "--", "sleep", "8")
    job = g.hostrun_cmd("-m", "40M", "--", "sleep", "8")
    balloon = g.hostrun_cmd("session", "--label", "greedy", "-m", "60M", "--", "python3", "-c",
                            "import time; x = bytearray(200 << 20); time.sleep(5)")
    script = (f"{calm} >/dev/null 2>&1 & a=$!; {job} >/dev/null 2>&1 & b=$!; sleep 2; "
              f"{balloon} >/dev/null 2>{g.dir}/greedy.err; echo $?; wait $a; echo $?; wait $b; echo $?")
    assert [int(w) for w in g.sh(script).stdout.split()] == [250, 0, 0]
    alerts = g.sh(f"cat {shlex.quote(g.state)}/alerts.jsonl").stdout
    assert "hostrun session --label greedy -m 512M" in alerts and "session:greedy" in alerts


PLACE = '[sessions]\nplace = true\ncap = "120M"\nfirst_booking = "40M"\n'


def _placed_agent(g: Any) -> str:
    """The stand-in agent (tests/system/test_session_place.py's) run in the guest: its SessionStart hook,
    then where it and its tool are once placed (or after 20 s), then it ends. Prints the hook's
    answer and the last ``where``."""
    from tests.support.agentsessions import AGENT
    from tests.support.claude import event

    g.sh(f"cat > {g.dir}/agent.py", input=AGENT)
    g.sh(f"cat > {g.dir}/event.json", input=json.dumps(event("session_start_startup", cwd=g.dir)))
    hook = g.hostrun_cmd("hook", "session-start")
    return g.sh(
        f"python3 {g.dir}/agent.py {shlex.quote(hook)} {g.dir}/where {g.dir}/go < {g.dir}/event.json & a=$!; "
        f"for i in $(seq 200); do [ -e {g.dir}/where ] && [ $(grep -c hostrun-session- {g.dir}/where) = 2 ] "
        "&& break; sleep 0.1; done; "
        f"cat {g.dir}/where.hook; echo; echo WHERE; cat {g.dir}/where; echo end > {g.dir}/go; wait $a",
        timeout=300).stdout


def test_root_places_a_running_session_into_a_scope_of_the_sessions_slice(guest: Any) -> None:
    """As root (the system manager) the SessionStart hook's placer starts a session scope around the
    running agent and its tool: both are then in ``<slice>-sessions.slice/hostrun-session-….scope``."""
    g = guest("root", extra=PLACE)
    out = _placed_agent(g)
    sessions_unit = g.slice_unit[: -len(".slice")] + "-sessions.slice"
    hook, where = out.split("WHERE", 1)
    assert "booked as an agent session" in hook, out
    assert where.count(f"/{sessions_unit}/hostrun-session-") == 2, out
    recorded = g.sh(f"for i in $(seq 300); do {g.hostrun_cmd('ledger', '--json')} | grep -q session:claude "
                    f"&& echo recorded && break; sleep 0.2; done; cat {g.state}/sessions.log")
    assert recorded.stdout.startswith("recorded"), recorded.stdout  # its peak, once it ended


def test_a_users_session_from_a_login_shell_is_told_why_it_cannot_be_placed(guest: Any) -> None:
    """A normal user's client started from an ssh login runs in ``session-N.scope`` (root's): their
    user manager cannot take it, and the hook says so in the session's context; nothing is booked."""
    g = guest("dev", extra=PLACE)
    out = _placed_agent(g)
    hook = out.split("WHERE", 1)[0]
    assert "cannot be placed" in hook and "user manager" in hook, out
    assert "hostrun-session-" not in out.split("WHERE", 1)[1]


@pytest.mark.parametrize("user", ["root", "dev"])
def test_sessions_that_would_overfill_their_slice_are_admitted_up_to_what_fits(guest: Any,
                                                                               user: str) -> None:
    """Booked at 80 MiB each in a 180 MiB sessions slice: two run at once, the third waits (saying
    the sessions slice holds it) and runs once one has ended."""
    g = guest(user, extra='[sessions]\nshare = 0.6\ncap = "100M"\nfirst_booking = "80M"\n')
    run = [g.hostrun_cmd("session", "--label", f"s{i}", "--", "sh", "-c",
                         f"date +%s.%N > {g.dir}/s{i}; sleep 3; date +%s.%N >> {g.dir}/s{i}")
           for i in range(3)]
    script = (f"{run[0]} & a=$!; {run[1]} & b=$!; "
              f"while [ ! -e {g.dir}/s0 ] || [ ! -e {g.dir}/s1 ]; do sleep 0.1; done; "
              f"{run[2]} 2>{g.dir}/third.err; echo $?; wait $a; echo $?; wait $b; echo $?; "
              f"cat {g.dir}/s0 {g.dir}/s1 {g.dir}/s2; grep -c 'sessions slice' {g.dir}/third.err")
    out = g.sh(script).stdout.split()
    assert out[:3] == ["0", "0", "0"], out
    s0, s1, s2 = (tuple(float(x) for x in out[3 + 2 * i:5 + 2 * i]) for i in range(3))
    assert s2[0] >= min(s0[1], s1[1]) - 0.05, out  # the third started once one had ended
    assert int(out[-1]) >= 1, out  # its waiting line named the sessions slice
