"""A real agent session (``hostrun session``) with a job started inside it, and a job started beside
it, running until ``stop``: what ``hostrun report`` and ``hostrun top`` are checked against
(tests/system/test_sessions_report.py, tests/system/test_top_screen.py)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import textwrap
from typing import Any

from tests.conftest import Hostrun, wait_for


def configure_sessions(hostrun: Hostrun) -> None:
    """A 600 MiB slice whose sessions slice is half of it (300 MiB); sessions booked at 64 MiB."""
    hostrun.configure(slice="600M", top='[sessions]\nshare = 0.5\ncap = "256M"\nfirst_booking = "64M"\n')


class SessionWithJob:
    """Session ``session:agent`` (cap 200 MiB) running job ``inside`` (50 MiB), and job ``outside``
    (40 MiB) started by the test; all three running once made."""

    def __init__(self, hostrun: Hostrun, seconds: int = 60) -> None:
        self.hostrun = hostrun
        inner = shlex.join(hostrun.argv("-m", "50M", "-l", "inside", "--", "sleep", str(seconds)))
        self.procs: list[subprocess.Popen[str]] = [
            hostrun.popen("session", "--label", "agent", "-m", "200M", "--", "sh", "-c", f"{inner}; true")]
        wait_for(lambda: self.running("inside"), timeout=30)
        self.procs.append(hostrun.popen("-m", "40M", "-l", "outside", "--", "sleep", str(seconds)))
        wait_for(lambda: self.running("outside"), timeout=30)

    def running(self, label: str) -> Any:
        """The running booking of ``label``: (id, label, state, pid, size, cgroup), or None."""
        return next((b for b in self.hostrun.bookings() if b[1] == label and b[2] == "running"), None)

    def stop(self) -> None:
        """The job inside ends first (SIGTERM to its holder, which ends its job), then the session
        and the outside job. Not the session first: its end kills its cgroup, where the inside job's
        holder and guardian are, and the job itself would run on, unbooked."""
        inside = self.running("inside")
        if inside is not None:
            os.kill(inside[3], signal.SIGTERM)
            wait_for(lambda: self.running("inside") is None, timeout=30)
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=60)


# A stand-in agent (tests/system/test_session_place.py, tests/vm/test_vm_sessions.py, bench/bench_session.py):
# named as the client's process is, with a tool child, it runs the SessionStart hook as Claude Code
# does (``sh -c``), then writes where it and its tool are until told to end (or to balloon).
AGENT = textwrap.dedent("""\
    import json, os, subprocess, sys, time
    open("/proc/self/comm", "w").write("fake-agent")  # as the client's own process is named
    hook, out, go = sys.argv[1], sys.argv[2], sys.argv[3]
    if sys.argv[4:] == ["subreaper"]:  # orphans below it become its children: the placer too
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    tool = subprocess.Popen(["sleep", "300"])
    job = subprocess.Popen(os.environ["AGENT_JOB"], shell=True) if os.environ.get("AGENT_JOB") else None
    while os.environ.get("AGENT_JOB_READY") and not os.path.exists(os.environ["AGENT_JOB_READY"]):
        time.sleep(0.05)  # the job runs in its own cgroup before the session starts
    answer = subprocess.run(["sh", "-c", hook], input=sys.stdin.read(), capture_output=True, text=True)
    with open(out + ".hook", "w") as fh:
        fh.write(answer.stdout)
    while not os.path.exists(go):
        with open(out + ".tmp", "w") as fh:
            fh.write(open("/proc/self/cgroup").read() + "TOOL " + open(f"/proc/{tool.pid}/cgroup").read())
        os.replace(out + ".tmp", out)
        time.sleep(0.1)
    what = open(go).read()
    if what == "balloon":
        x = bytearray(400 << 20)
        time.sleep(5)
    tool.kill()
    if job is not None:
        job.terminate()
        job.wait()
""")
