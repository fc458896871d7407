"""``dispatch.core.exitcodes.ExitCode`` at run time is an int subclass with ``enum.IntEnum``'s
behaviour, built without importing ``enum`` (~2 ms of every hostrun call): here it is held against a
real ``IntEnum`` of the same table, member for member."""

from __future__ import annotations

import copy
import enum
import pickle

import pytest

from dispatch.core.exitcodes import MEANINGS, ExitCode, outcome_name

Reference = enum.IntEnum("ExitCode", [(code.name, int(code)) for code in ExitCode])  # type: ignore[misc]


def test_the_members_are_intenums() -> None:
    assert [(c.name, c.value) for c in ExitCode] == [(r.name, r.value) for r in Reference]
    assert len(ExitCode) == len(Reference) == len(MEANINGS)
    for code in ExitCode:
        ref = Reference[code.name]
        assert type(code) is ExitCode and isinstance(code, int)
        assert (repr(code), str(code), f"{code}", f"{code:>5}", f"{code:x}", "%d" % code) == (  # noqa: UP031
            repr(ref), str(ref), f"{ref}", f"{ref:>5}", f"{ref:x}", "%d" % ref)  # noqa: UP031
        assert code == ref == int(ref) and hash(code) == hash(ref) == hash(int(ref))
        assert ExitCode(int(code)) is code and ExitCode[code.name] is code
        assert pickle.loads(pickle.dumps(code)) is code and copy.deepcopy(code) is code
        assert code.outcome == code.name.lower().replace("_", "-") and code.meaning == MEANINGS[code]
    assert list(ExitCode.__members__) == list(Reference.__members__)


@pytest.mark.parametrize("value", [7, 0, "250", None, 250.5])
def test_an_unknown_value_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError) as ours:
        ExitCode(value)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as theirs:
        Reference(value)
    assert str(ours.value) == str(theirs.value)
    assert outcome_name(7) == "error"


def test_members_cannot_be_reassigned() -> None:
    with pytest.raises(AttributeError):
        ExitCode.OWN_CAP = 3  # type: ignore[misc]
    assert ExitCode.OWN_CAP == 250

