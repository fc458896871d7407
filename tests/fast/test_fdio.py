"""``dispatch.core.fdio``: whole buffers written, and a job's forwarded output dropped when its reader
went away (the job goes on), rather than three loops with three policies."""

from __future__ import annotations

import os
import threading

import pytest

from dispatch.core.fdio import forward, write_all


def test_write_all_writes_more_than_a_pipe_holds() -> None:
    r, w = os.pipe()
    data = os.urandom(1 << 20)  # 16 pipe buffers: os.write returns short writes here
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(r, 65536):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    write_all(w, data)
    os.close(w)
    reader.join(timeout=30)
    os.close(r)
    assert bytes(got) == data


def test_a_closed_reader_is_an_error_to_write_all_and_dropped_by_forward() -> None:
    r, w = os.pipe()
    os.close(r)
    try:
        with pytest.raises(BrokenPipeError):
            write_all(w, b"x")
        forward(w, b"the job's output, with nobody reading")  # no exception
    finally:
        os.close(w)
