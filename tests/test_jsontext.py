"""``dispatch.core.jsontext.loads`` (the hooks' JSON reader without ``import json``) gives what
``json.loads`` gives, value for value, and fails where it fails with json's own message."""

from __future__ import annotations

import json
import math

import pytest

from dispatch.core.jsontext import loads

VALID = [
    '{"session_id": "abc", "tool_input": {"command": "ls -la"}, "n": 3, "x": 1.5e3, "ok": true}',
    '  \n\t{"a": [1, 2, {"b": null}], "c": false}\r\n ',
    '"just a string"', "42", "-0.0", "[]", "{}", '{"u": "\\u00e9\\ud83d\\ude00 \\n \\" \\\\"}',
    '{"dup": 1, "dup": 2}', '{"big": 123456789012345678901234567890}',
    json.dumps({"command": "x" * 100_000, "nested": [[[[[]]]]]}),
]
INVALID = ["", " ", "{", '{"a": 1,}', "[1 2]", "{'a': 1}", '{"a": 1} trailing', '{"a": 1}}', "nul",
           '"unterminated', '"\x01 control"', "\ufeff{}", '{"a": NaN', "01"]


@pytest.mark.parametrize("text", VALID)
def test_the_same_values_as_json(text: str) -> None:
    assert loads(text) == json.loads(text)


def test_constants_as_json_reads_them() -> None:
    assert loads("[NaN, Infinity, -Infinity]")[1:] == [math.inf, -math.inf]
    assert math.isnan(loads("[NaN]")[0])


@pytest.mark.parametrize("text", INVALID)
def test_the_same_errors_as_json(text: str) -> None:
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    with pytest.raises(ValueError) as ours:
        loads(text)
    assert str(ours.value) == str(theirs.value)
