"""A controller and one real sshd peer set up for a ``--peer`` run, and what the peer holds after."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Hostrun

PY = sys.executable


TOP = 'enable_across_machines = true\ntoolchain_probes = ["rsync --version"]'


def make_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / ".gitignore").write_text("target/\n*.log\n")
    (tree / "src" / "main.txt").write_text("fn main\n")
    (tree / "README").write_text("readme v1\n")
    (tree / "target").mkdir()
    (tree / "target" / "big.bin").write_text("ignored build output\n")
    (tree / "debug.log").write_text("ignored log\n")
    return tree


def setup(hostrun: Hostrun, peers: Any, tmp_path: Path, slice: str = "300M", host_extra: str = "",
          **peer_kw: Any) -> tuple[Any, Path]:
    peer = peers("peer1", "127.0.0.2", slice=slice, **peer_kw)
    hostrun.configure(top=TOP, peers=peer.host_table(host_extra))
    return peer, make_tree(tmp_path)


def remote_tree(peer: Any) -> Path:
    (tree,) = (peer.home / "hostrun-work").iterdir()
    return tree


def peer_bookings(peer: Any) -> list[tuple[Any, ...]]:
    db = peer.state_dir / "ledger.sqlite3"
    if not db.exists():
        return []
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute("SELECT id, label, state FROM bookings").fetchall()
    finally:
        con.close()


def rsync_logger(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``rsync`` logs each argv (one JSON line) and runs the real one."""
    real = shutil.which("rsync")
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "rsync.jsonl"
    wrapper = bin_dir / "rsync"
    wrapper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                       f"with open({str(log)!r}, 'a') as fh: fh.write(json.dumps(sys.argv[1:]) + '\\n')\n"
                       f"os.execv({real!r}, [{real!r}, *sys.argv[1:]])\n")
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def syncs(log: Path) -> list[str]:
    """Each sync rsync started so far (the ones with ``-e``): "paths" or "full"."""
    if not log.exists():
        return []
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    return ["paths" if "--files-from=-" in argv else "full" for argv in runs if "-e" in argv]
