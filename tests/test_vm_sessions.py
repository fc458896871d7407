"""Agent sessions (``hostrun session``) on a real systemd with cgroup v2, in the test VM, as root (the
system manager) and as a normal user (their own user manager): the session's scope in the sessions
slice (a child of the slice unit) with its cap and high mark, the jobs it starts in scopes of the
slice, and a session that balloons past its cap ending 250 alone. The "agent" is a stand-in process
tree (``sh``, ``python3``); the real client's tier runs Claude Code itself.
"""

from __future__ import annotations

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
