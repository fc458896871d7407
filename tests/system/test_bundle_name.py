"""The agent's name (``<version>-<content hash>``) is remembered under a stamp of the sources' stat
data (``dispatch.hosts.ssh.bundle.name``). Run on a real copy of ``dispatch/`` in a subprocess each time
(the name is kept per process): a changed source must give a new name even when its size and mtime
are put back, and a remembered name only we could have written is the only one used."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OtherUser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "dispatch", tmp_path / "src" / "dispatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "src"


def agent_name(src: Path, cache_home: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(src), XDG_CACHE_HOME=str(cache_home), PYTHONDONTWRITEBYTECODE="1")
    code = "from dispatch.hosts.ssh import bundle; print(bundle.name())"
    proc = subprocess.run([sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=60, cwd=src)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_name_is_remembered_and_any_change_to_a_source_is_seen(copy: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = agent_name(copy, cache)
    remembered = cache / "hostrun" / "bundle" / "name"
    assert (remembered.stat().st_mode & 0o777, remembered.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    stamp, _, kept = remembered.read_text().strip().partition(" ")
    assert kept == first == agent_name(copy, tmp_path / "fresh")  # a fresh cache hashes the contents
    remembered.write_text(f"{stamp} 0.1.0-remembered\n")
    assert agent_name(copy, cache) == "0.1.0-remembered"  # read back, not recomputed

    source = copy / "dispatch" / "local" / "admission" / "ledger.py"
    before = source.stat()
    data = source.read_bytes()
    source.write_bytes(data.replace(b"import", b"IMPORT", 1))  # same size
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime
    changed = agent_name(copy, cache)
    assert changed not in (first, "0.1.0-remembered")
    assert changed == agent_name(copy, tmp_path / "fresh2")


def test_a_remembered_name_others_could_have_written_is_ignored(copy: Path, tmp_path: Path,
                                                                other_user: OtherUser) -> None:
    """Think like the other user: the stamp is public (anyone may stat the sources), so they write
    the right stamp with an older agent's name into a cache root runs with. It must not be used,
    and hostrun must not write its own name into their directory either."""
    truth = agent_name(copy, tmp_path / "fresh")
    ours = tmp_path / "cache"
    agent_name(copy, ours)
    stamp = (ours / "hostrun" / "bundle" / "name").read_text().split()[0]

    theirs = other_user.home / "cache"
    other_user.run(["mkdir", "-p", str(theirs / "hostrun" / "bundle")])
    other_user.run(["sh", "-c", f"echo '{stamp} 0.1.0-older' > {theirs}/hostrun/bundle/name"])
    assert agent_name(copy, theirs) == truth
    assert (theirs / "hostrun" / "bundle" / "name").read_text().split()[1] == "0.1.0-older"
    assert (theirs / "hostrun" / "bundle" / "name").stat().st_uid == other_user.uid

    loose = tmp_path / "loose"
    (loose / "hostrun" / "bundle").mkdir(parents=True)
    (loose / "hostrun" / "bundle" / "name").write_text(f"{stamp} 0.1.0-older\n")
    (loose / "hostrun" / "bundle").chmod(0o777)  # ours, but anyone could have swapped the file
    assert agent_name(copy, loose) == truth
