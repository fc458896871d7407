"""The error tree lives in one module, with typed fields, and the code → outcome helper.

Pure checks: the ``ast`` of ``dispatch/`` (no import of it needed) and ssh's own recorded wording.
"""

from __future__ import annotations

import ast
from pathlib import Path

from dispatch.core.errors import (
    ConnectionLostError,
    GpuError,
    HostKeyError,
    HostrunError,
    LockTimeoutError,
    NotRunError,
    PeerAuthError,
    PeerUnreachableError,
    SyncFailedError,
    ToolchainMismatchError,
)
from dispatch.core.exitcodes import ExitCode, outcome_name
from dispatch.hosts.ssh.transport import classify, is_transient

PACKAGE = Path(__file__).resolve().parents[2] / "dispatch"


def _error_names() -> set[str]:
    tree = ast.parse((PACKAGE / "core" / "errors.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def test_every_hostrun_error_class_is_defined_in_errors_py() -> None:
    """A class anywhere else in dispatch/ that derives from one of errors.py's classes is a stray."""
    names = _error_names()
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE / "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & names:
                    strays.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert strays == []


def test_the_errors_docstring_draws_every_class() -> None:
    import dispatch.core.errors as errors

    assert errors.__doc__ is not None
    missing = [name for name in _error_names() if name not in errors.__doc__]
    assert missing == []


def test_every_error_has_the_exit_code_its_docstring_tree_draws() -> None:
    """The tree in errors.py's docstring is the reference: each class gives the code drawn beside it
    (a class that names none inherits its parent's)."""
    import re

    import dispatch.core.errors as errors

    drawn = dict(re.findall(r"(\w+Error)\s+(\d+)\s", errors.__doc__ or ""))
    assert set(drawn) == _error_names() - {"HostrunError"}  # the root draws no number
    given = {name: str(int(getattr(errors, name)("x").exit_code)) for name in drawn}
    assert given == drawn


def test_moved_errors_keep_their_exit_codes() -> None:
    assert SyncFailedError("x").exit_code == ExitCode.SYNC_FAILED
    assert ConnectionLostError("x").exit_code == ExitCode.CONNECTION_LOST
    assert ToolchainMismatchError("x").exit_code == ExitCode.TOOLCHAIN_MISMATCH
    assert LockTimeoutError("x").exit_code == ExitCode.NOT_RUN
    assert GpuError("x").exit_code == ExitCode.NOT_RUN and isinstance(GpuError("x"), NotRunError)


def test_host_is_a_typed_field() -> None:
    assert HostrunError("x").host is None
    assert SyncFailedError("x", host="gpu1").host == "gpu1"
    error = ConnectionLostError("x")
    error.host = "gpu2"
    assert error.host == "gpu2"


def test_classify_gives_every_peer_error_a_transient_field() -> None:
    """ssh's own wording (OpenSSH 9): refused is weather; host key and authentication are not."""
    refused = classify("p", "ssh: connect to host 10.0.0.9 port 22: Connection refused\n")
    assert type(refused) is PeerUnreachableError and refused.transient and is_transient(refused)
    unknown = classify("p", "ssh: Could not resolve hostname nowhere: Name or service not known\n")
    assert type(unknown) is PeerUnreachableError and not unknown.transient
    key = classify("p", "Host key verification failed.\n")
    assert isinstance(key, HostKeyError) and not key.transient and not is_transient(key)
    auth = classify("p", "root@10.0.0.9: Permission denied (publickey).\n")
    assert isinstance(auth, PeerAuthError) and not auth.transient
    assert not is_transient(OSError("Connection refused"))


def test_outcome_name() -> None:
    assert outcome_name(ExitCode.SYNC_FAILED) == "sync-failed"
    assert outcome_name(78) == "not-run"
    assert outcome_name(1) == "error"
    assert outcome_name(77) == "error"


def test_a_reader_that_went_away_gets_141_and_no_traceback() -> None:
    """``hostrun codes --json | head -7``: when ``head`` has exited before hostrun writes (its pipe's
    read end closed here beforehand, so it always has), the write fails with EPIPE; hostrun ends 141
    (128 + SIGPIPE) without a traceback (before: BrokenPipeError's, seen in the docs' example)."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "dispatch", "codes", "--json"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
