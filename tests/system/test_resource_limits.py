"""Under a real fd limit the CLI ends with one line and 78, and leaves nothing booked."""

from __future__ import annotations

import os
import resource
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ON_CI, Hostrun


def _limit(n: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


@pytest.mark.parametrize("fds", [8, 12])
def test_fd_limit_is_one_line_and_78(hostrun: Hostrun, fds: int) -> None:
    hostrun.configure()
    done = hostrun.run("-m", "32M", "--", "true", capture_output=True, preexec_fn=_limit(fds))
    assert "Traceback" not in done.stderr, done.stderr
    if fds == 12 and done.returncode == 0:  # 12 fds may just suffice once procinfo stops misreading
        assert done.stderr == ""
    else:
        assert done.returncode == 78, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        # what fails is named: an engine this run starts under its limit says it has too few
        # descriptors; one already running admits it, then the guardian's pipe fails; a run taking
        # the ledger's lock itself fails at the ledger's (EMFILE) or the pipe
        assert fds != 8 or "pipe" in done.stderr or "(EMFILE)" in done.stderr \
            or "its limit on open files is 8" in done.stderr, done.stderr
    assert hostrun.bookings() == []


def test_fork_under_a_pids_limit_is_one_line_and_78(hostrun: Hostrun, tmp_path: Path) -> None:
    """A real pids cgroup with pids.max 2 (hostrun itself and one more): the job's fork fails."""
    root = Path("/sys/fs/cgroup/pids")
    if not (root / "cgroup.procs").exists():
        if ON_CI:
            pytest.fail("CI=true but no cgroup v1 pids controller is mounted")
        pytest.skip("no cgroup v1 pids controller mounted")  # only off CI: with CI=true it fails
    group = root / f"hostrun-test-pids-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "pids.max").write_text("2")
        hostrun.configure()

        def enter() -> None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

        done = hostrun.run("-m", "32M", "--", "true", capture_output=True, preexec_fn=enter)
    finally:
        group.rmdir()
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 78, done.stderr
    assert done.stderr.count("\n") == 1 and "fork" in done.stderr, done.stderr
    assert hostrun.bookings() == []
