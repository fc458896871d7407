"""A controller and one real sshd peer set up for a ``--peer`` run, and what the peer holds after."""

from __future__ import annotations

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
