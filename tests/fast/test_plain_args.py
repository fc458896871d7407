"""``hostrun report`` parses its plain long options without argparse (``cli.common.plain_args``):
where it answers, the answer must be argparse's; everything else must go to argparse."""

from __future__ import annotations

import pytest

from dispatch.cli.common import plain_args as _plain_args
from dispatch.cli.common import sub_parser as _sub_parser


def _argparse(argv: list[str]) -> dict[str, object]:
    p = _sub_parser("report", "test")
    p.add_argument("--host", action="append", metavar="NAME")
    return vars(p.parse_args(argv))


@pytest.mark.parametrize("argv", [
    [], ["--json"], ["--json", "--json"], ["--host", "a"], ["--host=a", "--host", "b"], ["--host="],
    ["--host", ""], ["--config", "/x.toml", "--json"], ["--config=/x.toml", "--config", "/y.toml"],
    ["--host", "a b", "--json", "--config=/p q"], ["--host", "a=b"],
])
def test_plain_forms_parse_as_argparse_does(argv: list[str]) -> None:
    plain = _plain_args(argv, switches=("json",), repeated=("host",))
    assert plain is not None
    assert vars(plain) == _argparse(argv)


@pytest.mark.parametrize("argv", [
    ["-h"], ["--help"], ["--js"], ["--hos", "a"], ["--json=1"], ["--host"], ["--host", "-x"],
    ["--host", "--json"], ["--", "--json"], ["x"], ["-j"], ["--config"], ["--other", "a"],
])
def test_anything_else_goes_to_argparse(argv: list[str]) -> None:
    assert _plain_args(argv, switches=("json",), repeated=("host",)) is None
