"""Under a real fd limit the CLI ends with one line and 78, and leaves nothing booked."""

from __future__ import annotations

import resource
from typing import Any

import pytest

from tests.conftest import Hostrun


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
    assert hostrun.bookings() == []
