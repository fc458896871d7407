"""A booking's cgroup path is acted on only when it is one of this slice's job cgroups.

Real cgroup v1 throughout: a "victim" cgroup with a real ``sleep`` in it sits next to the test's
slice (under this process's own memory cgroup, like the slice), and a booking row written straight
into the test's ledger names it in various ways. The next admission reclaims the row (its holder is
dead) and must leave the victim alone; ``hostrun ledger`` flags the row as invalid meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.errors import ConfigError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import MiB
from dispatch.local.admission.ledger import Ledger
from dispatch.local.store.ledgerdb import NewBooking
from tests.conftest import Hostrun, pid_alive


class Victim:
    """A cgroup hostrun must never touch, with a live process in it; removed at teardown."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir()
        self.proc = subprocess.Popen(["sleep", "300"])
        (directory / "cgroup.procs").write_text(str(self.proc.pid))

    def intact(self) -> bool:
        return (pid_alive(self.proc.pid) and self.dir.is_dir()
                and str(self.proc.pid) in (self.dir / "cgroup.procs").read_text().split())

    def remove(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.dir.exists():
            self.dir.rmdir()


@pytest.fixture
def victim(hostrun: Hostrun) -> Iterator[Callable[[Path], Victim]]:
    made: list[Victim] = []

    def make(directory: Path) -> Victim:
        made.append(Victim(directory))
        return made[-1]

    try:
        yield make
    finally:
        for v in made:
            v.remove()


def _dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def _book(hostrun: Hostrun, cgroup: str) -> int:
    """A running booking of a dead holder whose row names ``cgroup``, written straight to the ledger."""
    ledger = Ledger(str(hostrun.state_dir))
    try:
        bid = ledger.enqueue(NewBooking(host="local", label="forged", pid=_dead_pid(), pid_start=1,
                                        size=64 * MiB,
                                        cap=64 * MiB, kind="cap", command="x", session=None))
        ledger.db.execute("UPDATE bookings SET state = 'running', since = 0, cgroup = ? WHERE id = ?",
                          (cgroup, bid))
    finally:
        ledger.close()
    return bid


# The victim is named like a job cgroup, so only where it is (not its name) tells it apart.
OUTSIDE = {
    "dotdot": lambda slice_dir, victim: f"{slice_dir}/../{victim.name}",
    "dotdot-through-a-job": lambda slice_dir, victim: f"{slice_dir}/job-1-1/../../{victim.name}",
    "absolute-elsewhere": lambda slice_dir, victim: str(victim),
    "trailing-dotdot": lambda slice_dir, victim: f"{victim}/job-1-1/..",
}
# A symbolic link inside the slice pointing out cannot be made on cgroupfs (symlink() is EPERM there),
# so that variant is covered against the fake cgroup2 tree in test_capping_v2_fake.py.


@pytest.mark.parametrize("shape", sorted(OUTSIDE))
def test_reclaim_leaves_a_cgroup_outside_the_slice_alone(hostrun: Hostrun, victim: Any,
                                                         shape: str) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # creates the slice and ledger
    v = victim(hostrun.slice_dir.parent / f"job-{uuid.uuid4().int % 10**9}-1")
    _book(hostrun, OUTSIDE[shape](hostrun.slice_dir, v.dir))
    proc = hostrun.run("-m", "64M", "--", "true", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert hostrun.bookings() == []  # the dead holder's row is still released
    assert v.intact()


@pytest.mark.parametrize("name", ["not-a-job", "job-1", "job-1-2-3", "job-x-1"])
def test_reclaim_leaves_a_slice_child_not_named_like_a_job_alone(hostrun: Hostrun, victim: Any,
                                                                 name: str) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    v = victim(hostrun.slice_dir / name)
    _book(hostrun, str(v.dir))
    try:
        assert hostrun.run("-m", "64M", "--", "true", timeout=30).returncode == 0
        assert hostrun.bookings() == []
        assert v.intact()
    finally:
        v.remove()  # before the fixture's leak check, which would count it as left in the slice


def test_ledger_flags_a_row_whose_cgroup_is_outside_the_slice(hostrun: Hostrun, victim: Any) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    v = victim(hostrun.slice_dir.parent / "job-424242-1")
    forged = _book(hostrun, f"{hostrun.slice_dir}/../{v.dir.name}")
    fine = _book(hostrun, str(hostrun.slice_dir / "job-999-1"))  # a legitimate, vanished job cgroup
    shown = json.loads(hostrun.run("ledger", "--json").stdout)
    rows = {r["id"]: r for r in shown["running"]}
    assert rows[forged]["invalid"] == "cgroup outside the slice"
    assert rows[fine]["invalid"] is None
    assert rows[forged]["stale"] is True
    human = hostrun.run("ledger", env={**os.environ, "COLUMNS": "300"})  # no wrapping in the table
    assert human.returncode == 0
    assert human.stdout.count("invalid: cgroup outside the slice") == 1
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # reclaims both rows
    assert json.loads(hostrun.run("ledger", "--json").stdout)["running"] == []
    assert v.intact()


@pytest.mark.parametrize("tail", ["x/../../../escape-{tag}", "../escape-{tag}", "./escape-{tag}",
                                  "a//escape-{tag}", "escape-{tag}/.."])
def test_configured_cgroup_with_dot_components_exits_2_and_creates_nothing(hostrun: Hostrun,
                                                                           tail: str) -> None:
    tag = uuid.uuid4().hex[:8]
    own = hostrun.cgroup.rsplit("/", 1)[0]
    hostrun.cgroup = f"{own}/{tail.format(tag=tag)}"
    hostrun.configure()
    before = set(os.listdir(hostrun.mount))
    proc = hostrun.run("-m", "64M", "--", "true")
    assert proc.returncode == ExitCode.USAGE
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("hostrun: error: ") and "hosts.local.cgroup" in line
    assert set(os.listdir(hostrun.mount)) == before
    for base in (hostrun.mount, hostrun.mount + own, hostrun.mount + own + "/x",
                 hostrun.mount + own + "/a"):
        assert not os.path.exists(f"{base}/escape-{tag}")
    assert not os.path.exists(hostrun.mount + own + "/x")
    assert not hostrun.slice_dir.exists()


def test_peer_agent_refuses_a_configured_cgroup_with_dotdot(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer agent builds its settings without pydantic: the same rule applies there."""
    from dispatch.agent import prepare as agentprep

    cfg = tmp_path / "hosts.toml"
    cfg.write_text("[hosts.local]\ncgroup = '/a/../../escape'\n")
    monkeypatch.setenv("HOSTRUN_CONFIG", str(cfg))
    settings, notes = agentprep.peer_settings({})
    assert "hosts.local.cgroup" in (notes["config_error"] or "")
    assert settings.local.cgroup is None


def test_a_bad_cgroup_that_skipped_the_config_check_is_no_slice(tmp_path: Path) -> None:
    """A value that reached the settings some other way (the controller's fallback on a peer) never
    makes a slice: every backend's probe refuses it, naming the key."""
    from dispatch.capping import probe_all
    from dispatch.core.settings import HostSettings

    probes = probe_all(HostSettings("local", cgroup="/x/../../escape"))
    assert probes and all(not p.ok and "hosts.local.cgroup" in p.detail for _, p in probes)


def test_a_plain_cgroup_is_accepted_and_one_trailing_slash_dropped() -> None:
    from dispatch.core.configfile import settings_from_dict

    settings = settings_from_dict({"hosts": {"local": {"cgroup": "/ci/hostrun-jobs/"}}}, "hosts.toml")
    assert settings.local.cgroup == "/ci/hostrun-jobs"
    for bad in ("/", "//", "ci/hostrun", "/ci//hostrun", "/ci/./hostrun", "/ci/..", "/ci/x\0"):
        with pytest.raises(ConfigError, match=r"^hosts\.toml: hosts\.local\.cgroup: must "):
            settings_from_dict({"hosts": {"local": {"cgroup": bad}}}, "hosts.toml")
