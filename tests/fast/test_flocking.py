"""``dispatch.core.flocking``, the one way hostrun takes a lock file: at once, waiting, or by a deadline."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.core.flocking import flock_by, flock_wait, try_flock


@pytest.fixture
def two_fds(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """Two open file descriptions of one file: flock treats them as two holders."""
    path = tmp_path / "lock"
    first = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    second = os.open(path, os.O_RDWR)
    try:
        yield first, second
    finally:
        os.close(first)
        os.close(second)


def test_try_flock_is_refused_while_another_holds_it(two_fds: tuple[int, int]) -> None:
    first, second = two_fds
    assert try_flock(first)
    assert not try_flock(second)
    assert not try_flock(second, shared=True)
    assert not flock_by(second, time.monotonic() + 0.05)  # patience runs out
    os.close(os.dup(first))  # a duplicate closed: the lock stays
    assert not try_flock(second)


def test_shared_locks_coexist_and_keep_out_an_exclusive_one(two_fds: tuple[int, int]) -> None:
    first, second = two_fds
    assert try_flock(first, shared=True)
    assert try_flock(second, shared=True)
    assert not flock_by(first, time.monotonic())  # one try at the deadline: the other shares it


def test_flock_wait_and_flock_by_take_a_free_lock(two_fds: tuple[int, int]) -> None:
    first, second = two_fds
    flock_wait(first)
    assert not try_flock(second)
    import fcntl

    fcntl.flock(first, fcntl.LOCK_UN)
    assert flock_by(second, time.monotonic() + 1.0)
    assert not try_flock(first)


def test_a_bad_descriptor_is_an_error_not_a_holder() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError):
        try_flock(fd)
