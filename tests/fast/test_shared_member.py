"""A member of an installed shared slice never runs outside it by accident (the decision in
``capping.select_backend``, with a real unit file and the real probes; the VM test
``test_vm_shared`` checks the same with a real daemon stopped, gone and stalled)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatch.capping import select_backend, sharedmember
from dispatch.capping.cgroupfs import SOCKET_ENV, parse_mountinfo, read_self_files
from dispatch.core.errors import SharedError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.settings import HostSettings

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the unit must be root's alone: needs root"),
    pytest.mark.skipif("cgroup2" not in parse_mountinfo(read_self_files()[1]),
                       reason="a shared slice needs a cgroup2 hierarchy"),
]


def _unit(tmp_path: Path, group: str) -> Path:
    unit = tmp_path / "hostrun-shared.socket"
    unit.write_text(f"[Socket]\nListenStream=/run/hostrun/shared.sock\nSocketGroup={group}\n")
    unit.chmod(0o644)
    return unit


@pytest.fixture
def no_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path / "gone.sock"))  # the socket a start limit removed


def test_a_member_whose_daemon_is_gone_ends_78(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_daemon: None) -> None:
    monkeypatch.setattr(sharedmember, "UNIT_PATH", str(_unit(tmp_path, "root")))
    with pytest.raises(SharedError) as caught:
        select_backend(HostSettings("local"), 8 << 30)
    assert caught.value.exit_code == ExitCode.NOT_RUN == 78
    line = str(caught.value)
    assert "\n" not in line
    assert "shared slice of group root is installed here but not usable" in line
    assert "gone.sock" in line and "systemctl reset-failed hostrun-shared.socket" in line
    assert 'backend = "systemd"' in line


def test_the_opt_out_runs_outside_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_daemon: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sharedmember, "UNIT_PATH", str(_unit(tmp_path, "root")))
    backend = select_backend(HostSettings("local", backend="none"), 8 << 30)
    assert backend.name == "none"
    assert "running outside the shared slice of group root (backend = 'none'" in capsys.readouterr().err


def test_no_member_no_unit_or_an_untrusted_unit_falls_back_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_daemon: None) -> None:
    others = tmp_path / "others"
    others.mkdir()
    for path in (str(tmp_path / "absent"),
                 str(_unit(others, "root")),  # in a directory anyone may write: proves nothing
                 str(_unit(tmp_path, "hostrun-no-such-group"))):
        others.chmod(0o777)
        monkeypatch.setattr(sharedmember, "UNIT_PATH", path)
        assert select_backend(HostSettings("local"), 8 << 30).name != "shared"
    assert sharedmember.installed_group(str(others / "hostrun-shared.socket")) is None
    assert sharedmember.installed_group(str(tmp_path / "hostrun-shared.socket")) \
        == "hostrun-no-such-group"
