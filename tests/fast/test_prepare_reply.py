"""The agent's prepare answer (the ``P`` frame) is checked where the controller reads it: a bad one
is one line naming what is wrong (SyncFailedError, 252), never a traceback."""

from __future__ import annotations

import pytest

from dispatch.core.errors import SyncFailedError
from dispatch.hosts.ssh.peerrun import checked_prepared


def test_a_whole_answer_passes() -> None:
    answer = {"agent_version": "1", "workdir": "/w", "probes": {}, "copy": {"token": None, "clean": False}}
    assert checked_prepared(answer, "p1") == answer


@pytest.mark.parametrize(("answer", "what"), [
    ([1], "not an object"),
    ({"workdir": "/w"}, "no probes object"),
    ({"probes": {}, "workdir": 3}, "workdir that is not a text"),
    ({"probes": {}, "copy": {"token": 1, "clean": True}}, "copy that is not"),
])
def test_a_bad_answer_is_one_line_naming_what_is_wrong(answer: object, what: str) -> None:
    with pytest.raises(SyncFailedError) as raised:
        checked_prepared(answer, "p1")
    assert what in str(raised.value) and "\n" not in str(raised.value) and "p1" in str(raised.value)
