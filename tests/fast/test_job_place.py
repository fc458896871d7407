"""Where a ``--peer`` or login-node job runs in the copy of its tree (``remotetree.job_place``):
a directory whose name starts with ``..`` is inside the tree; a deleted current directory is one
line, exit 2, for ``--peer`` and a cluster alike (was a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.core.errors import UsageError
from dispatch.hosts.ssh.remotetree import job_place

ROOT = Path(__file__).resolve().parents[2]


def test_a_name_starting_with_two_dots_is_inside_the_tree(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    inside = tmp_path / "tree" / "..foo" / "sub"
    inside.mkdir(parents=True)
    monkeypatch.chdir(inside)
    assert job_place(str(tmp_path / "tree")) == (str(tmp_path / "tree"), os.path.join("..foo", "sub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="is outside the tree"):
        job_place(str(tmp_path / "tree"))


@pytest.mark.parametrize("host", ["peer1", "farm"])
def test_a_deleted_current_directory_is_one_line(tmp_path: Path, host: str) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"enable_across_machines = true\nstate_dir = '{tmp_path / 'state'}'\n"
                   "[hosts.peer1]\nssh = 'nowhere.invalid'\n"
                   f"[hosts.farm]\nkind = 'slurm'\nslurm_conf = '{tmp_path / 'slurm.conf'}'\n")
    (tmp_path / "slurm.conf").write_text("")
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, subprocess, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
            "sys.exit(subprocess.run(sys.argv[2:]).returncode)")
    done = subprocess.run([sys.executable, "-c", code, str(gone), sys.executable, "-m", "dispatch",
                           "--config", str(cfg), f"--host={host}", "--", "true"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert "the current directory no longer exists" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
