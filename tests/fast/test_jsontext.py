"""``dispatch.core.jsontext.loads`` (the hooks' JSON reader without ``import json``) gives what
``json.loads`` gives, value for value, and fails where it fails with json's own message."""

from __future__ import annotations

import collections
import json
import math

import pytest

from dispatch.core.exitcodes import ExitCode
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


# ``dumps``: what ``--result-file`` is written with (``core.outcome.write_result``).
def _result_like() -> dict[str, object]:
    from dispatch.core.outcome import Outcome, argv_b64

    outcome = Outcome(exit_code=137, outcome="signal", host="local", label="b\udcffad \u2028 \"q\"",
                      argv=["sh", "-c", "echo \x01\t\\ \udcfe"], peak_bytes=10 << 20, duration_s=0.25,
                      counters={"oom": 0, "oom_kill": 1}, message=None, hit_ceiling=True)
    data = outcome.to_dict()
    data["argv_b64"] = argv_b64(outcome.argv)
    return data


class _Text(str):
    pass


ENCODABLE: list[object] = [
    ExitCode.OWN_CAP, {"sub": [ExitCode.SLICE_FULL, _Text("x\n")]}, collections.OrderedDict(b=1, a=2),
    {}, [], (), "", 0, -1, 10**30, 0.1, -0.0, 1e300, 2.5e-8, True, False, None, "\u00e9\ud83d\ude00",
    {"b": [1, [], {}, {"z": None, "a": (1.5, "x")}], "a": {"nested": [[[]]]}, "": "empty key"},
    [float("inf"), float("-inf")],
]


@pytest.mark.parametrize("value", [*ENCODABLE, _result_like()])
def test_dumps_writes_what_json_writes(value: object) -> None:
    from dispatch.core.jsontext import dumps

    assert dumps(value) == json.dumps(value, indent=2, sort_keys=True)


def test_dumps_hands_what_it_does_not_know_to_json() -> None:
    from dispatch.core.jsontext import dumps

    assert dumps({1: "int key", 2: [3]}) == json.dumps({1: "int key", 2: [3]}, indent=2, sort_keys=True)
    assert dumps([float("nan")]) == json.dumps([float("nan")], indent=2, sort_keys=True)
    with pytest.raises(TypeError):  # json's own refusal
        dumps({"a": object()})
    with pytest.raises(TypeError):  # mixed key types: json cannot sort them either
        dumps({"a": 1, 2: 3})
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ValueError):  # json's "Circular reference detected"
        dumps(looped)


def test_argv_b64_is_base64_of_each_arguments_bytes() -> None:
    import base64
    import os

    from dispatch.core.outcome import argv_b64

    argv = ["", "plain", "caf\u00e9", "\udcff\udc80 raw bytes", "x" * 1000]
    assert argv_b64(argv) == [base64.b64encode(os.fsencode(a)).decode("ascii") for a in argv]
