"""A pid whose /proc entry cannot be read for lack of fds is "cannot tell", never "gone"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import os, resource, sys
    from dispatch.core import procinfo
    pid = os.getppid()
    started = procinfo.start_time(pid)
    resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    try:
        procinfo.start_time(pid)
        tell = "read"
    except procinfo.CannotTell:
        tell = "cannot-tell"
    print(procinfo.is_alive(pid, started), procinfo.is_stopped(pid), tell)
""")


def test_live_process_under_fd_limit_is_not_read_as_dead() -> None:
    """Real RLIMIT_NOFILE, every fd taken: the live parent must still read as alive."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False", "cannot-tell"]


def test_gone_pid_is_still_gone() -> None:
    """ENOENT (a pid that exited and was reaped) still reads as gone."""
    from dispatch.core import procinfo

    child = subprocess.Popen(["true"])
    child.wait()
    assert procinfo.start_time(child.pid) is None or child.pid == os.getpid()
    assert not procinfo.is_alive(child.pid, 1)
