"""A pid whose /proc entry cannot be read for lack of fds is "cannot tell", never "gone"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    assert procinfo.start_time(child.pid) is None
    assert not procinfo.is_alive(child.pid, 1)


RECLAIM = textwrap.dedent("""
    import os, resource, sys
    from dispatch.core.procinfo import start_time
    from dispatch.core.units import GiB, MiB
    from dispatch.local.admission.policy import Room
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.store.ledgerdb import NewBooking
    ledger = Ledger(sys.argv[1])
    holder, me = os.getppid(), os.getpid()
    def book(pid, label):
        return ledger.enqueue(NewBooking(host="local", label=label, pid=pid, pid_start=start_time(pid) or 0,
                                         size=MiB, cap=MiB, kind="cap", command=label, session=None))
    running, mine = book(holder, "running"), book(me, "mine")
    ledger.db.execute("UPDATE bookings SET state = 'running', since = 0 WHERE id = ?", (running,))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, hard))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    try:
        adm = ledger.try_admit(mine, "local", lambda rows: Room(GiB))
        outcome = f"admitted={adm.admitted} reclaimed={len(adm.reclaimed)}"
    finally:
        for fd in held:
            os.close(fd)
    print(outcome, sorted(b.label for b in ledger.bookings()))
""")


def test_reclaim_under_fd_limit_keeps_live_holders(tmp_path: Path) -> None:
    """A locked try with no fd left to read /proc: neither the live running holder's booking nor
    the trying process's own is reclaimed (before: both were, and the try raised LookupError)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", RECLAIM, str(state)], env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["admitted=True", "reclaimed=0", "['mine',", "'running']"]
