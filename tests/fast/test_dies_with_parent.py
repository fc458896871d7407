"""The test VM's qemu dies with the test process (``tests.support.vm.dies_with_this_process``), even
when that process is SIGKILLed (a pytest run ended by a timeout) and even though the session's VM is
started from a thread that ends once the VM is up (``conftest._VmStart``).

What is real: the launcher's code path, the one ``VM.boot`` starts qemu with (its thread, the
child's ``PR_SET_PDEATHSIG``, ``start_new_session`` as for qemu), called from a thread that then
ends, in a parent process killed with SIGKILL. What is stood in: ``sleep 600`` for qemu (no VM is
booted: that takes minutes). SIGKILL reaches any program alike, so qemu is not needed to show it.
Two controls keep the test honest: a plain ``Popen`` child outlives the killed parent (so the
binding is what ends the other), and a child bound from the ending thread itself dies with that
thread (why the launcher forks from a thread of its own).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]

PARENT = """
import ctypes, json, signal, subprocess, sys, threading, time
from tests.support.vm import PR_SET_PDEATHSIG, dies_with_this_process

pids = {}
prctl = ctypes.CDLL(None, use_errno=True).prctl


def boot():  # as conftest._VmStart does: start the machine in a thread that ends
    pids["tied"] = dies_with_this_process(["sleep", "600"], stdin=subprocess.DEVNULL,
                                          start_new_session=True).pid
    pids["naive"] = subprocess.Popen(["sleep", "600"], start_new_session=True, preexec_fn=lambda:
                                     prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)).pid


thread = threading.Thread(target=boot)
thread.start()
thread.join()
pids["plain"] = subprocess.Popen(["sleep", "600"], start_new_session=True).pid
print(json.dumps(pids), flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead; its new parent may not have reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_the_vm_launcher_s_child_dies_when_the_test_process_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    pids: dict[str, int] = {}
    try:
        assert parent.stdout is not None
        pids = json.loads(parent.stdout.readline())
        time.sleep(0.5)  # the starting thread has ended: a death signal tied to it has fired
        assert not _gone(pids["tied"]), "the launcher's child died with the thread that asked for it"
        wait_for(lambda: _gone(pids["naive"]), timeout=10)  # bound from the ended thread: gone
        assert not _gone(pids["plain"])
        parent.send_signal(signal.SIGKILL)
        assert parent.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: _gone(pids["tied"]), timeout=10)
        time.sleep(0.2)
        assert not _gone(pids["plain"]), "the control: a plain child outlives its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
