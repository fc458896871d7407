"""``auto.place_on_peer`` (``--peer``): where the job goes and what is noted, without ssh or root.

``auto.place`` (``--auto``) reads this host's real report, so it is covered by tests/system/test_two_hosts.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.core.configfile import make_host
from dispatch.core.errors import AcrossDisabledError, OverPeerCapError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.settings import HostSettings, Settings
from dispatch.core.units import GiB
from dispatch.hosts.ssh.keys import SPEC as SSH_KIND
from dispatch.placement.auto import Placement, forget_sent, place_on_peer
from dispatch.placement.pending import Pending


def settings(state: Path, across: bool = True) -> Settings:
    hosts = {"local": HostSettings("local"),
             "p1": make_host("p1", SSH_KIND, ssh="p1.example", peer_memory_cap=4 * GiB),
             "p2": make_host("p2", SSH_KIND, ssh="p2.example", default_cap=2 * GiB)}
    return Settings(state_dir=str(state), hosts=hosts, enable_across_machines=across)


def noted(state: Path) -> dict[str, int]:
    pending = Pending(str(state))
    try:
        return {host: p.memory for host, p in pending.active(3600).items()}
    finally:
        pending.close()


def test_a_named_peer_is_chosen_and_its_room_noted_until_forgotten(tmp_path: Path) -> None:
    conf = settings(tmp_path / "state")
    placed = place_on_peer(conf, "p2", "build", None, None)
    assert isinstance(placed, Placement)
    assert placed.host is not None and placed.host.name == "p2"
    assert (placed.refused, placed.reasons) == (None, ())
    assert noted(tmp_path / "state") == {"p2": 2 * GiB}  # no cap given: the peer's default cap
    forget_sent(conf, placed.note)
    assert noted(tmp_path / "state") == {}


def test_a_bare_peer_takes_the_first_configured_and_books_the_cap(tmp_path: Path) -> None:
    placed = place_on_peer(settings(tmp_path / "state"), True, "build", 3 * GiB, None)
    assert placed.host is not None and placed.host.name == "p1"
    assert noted(tmp_path / "state") == {"p1": 3 * GiB}


def test_peers_off_refuses_and_notes_nothing(tmp_path: Path) -> None:
    with pytest.raises(AcrossDisabledError) as caught:
        place_on_peer(settings(tmp_path / "state", across=False), "p1", "build", None, None)
    assert caught.value.exit_code == ExitCode.ACROSS_DISABLED
    assert not (tmp_path / "state").exists()


def test_over_the_peer_cap_refuses_and_notes_nothing(tmp_path: Path) -> None:
    with pytest.raises(OverPeerCapError) as caught:
        place_on_peer(settings(tmp_path / "state"), "p1", "build", 8 * GiB, None)
    assert caught.value.exit_code == ExitCode.OVER_PEER_CAP
    assert not (tmp_path / "state").exists()


def test_a_note_whose_hostrun_was_killed_goes_at_once(tmp_path: Path) -> None:
    """A hostrun SIGKILLed after sending a job never takes its note back: the note names its pid
    and start time, and goes as soon as that process is gone (not at the end of the window)."""
    import os
    import signal
    import subprocess
    import sys

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    code = ("import sys, time; from dispatch.placement.pending import Pending; "
            "p = Pending(sys.argv[1]); p.add('p1', 'build', 1 << 30); p.close(); "
            "print('noted', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(state)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "noted"
        assert noted(state) == {"p1": 1 << 30}  # its writer lives: counted
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert noted(state) == {}
