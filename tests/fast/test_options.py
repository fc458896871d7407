"""The run-option table and its fast parser (``dispatch.core.runoptions``): pure, no root needed."""

from __future__ import annotations

import pytest

from dispatch.core.errors import UsageError
from dispatch.core.runoptions import RUN_OPTIONS, RunOptions, parse_run_options, split_command


def test_every_option_is_one_field_of_the_record_and_back() -> None:
    """The table and the record cannot drift apart: one field per option, same order."""
    assert [opt.dest for opt in RUN_OPTIONS] == list(RunOptions._fields)


def test_defaults_say_absent() -> None:
    """Nothing given: flags False, valued options None, repeatable ones an empty tuple."""
    parsed = parse_run_options([])
    assert parsed == RunOptions()
    for opt in RUN_OPTIONS:
        value = getattr(parsed, opt.dest)
        if opt.repeat:
            assert value == ()
        elif opt.takes_value:
            assert value is None
        else:
            assert value is False


def test_forms_of_a_value_and_conversion() -> None:
    parsed = parse_run_options(["-m4G", "--label=build", "-l", "again", "--max-runtime", "30m",
                                "--threads=8", "--gpu-memory", "1G", "--expect-duration=2h"])
    assert parsed.memory_cap == 4 << 30
    assert parsed.label == "again"  # the last one given wins, as with argparse
    assert parsed.max_runtime == 1800.0
    assert parsed.threads == 8
    assert parsed.gpu_memory == 1 << 30
    assert parsed.expect_duration == 7200.0
    assert parse_run_options(["-m=2G"]).memory_cap == 2 << 30


def test_optional_value_flags_and_repeats() -> None:
    assert parse_run_options(["--peer"]).peer is True
    assert parse_run_options(["--peer=gpu1"]).peer == "gpu1"
    assert parse_run_options(["--long-job"]).long_job is True
    assert parse_run_options(["--long-job=@spec"]).long_job == "@spec"
    parsed = parse_run_options(["--peer", "--return", "out", "--return=logs", "--stdin", "--no-cap"])
    assert parsed.returns == ("out", "logs")
    assert (parsed.stdin, parsed.no_cap, parsed.auto) == (True, True, False)


@pytest.mark.parametrize("options, message", [
    (["--bogus"], "unrecognized arguments: --bogus (see 'hostrun --help')"),
    (["-m"], "argument -m/--memory-cap: expected one argument"),
    (["-m", "1k"], "argument -m/--memory-cap: too small: '1k' (a cap below 1M cannot run anything)"),
    (["--threads", "0"], "argument --threads: must be from 1 to 4096: 0"),
    (["--threads", "x"], "argument --threads: not a whole number: 'x'"),
    (["--max-runtime", "0s"], "argument --max-runtime: must be longer than 0: '0s'"),
    (["--no-cap=1"], "argument --no-cap: ignored explicit argument '1'"),
])
def test_errors_read_like_argparse(options: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_run_options(options)
    assert str(caught.value) == message
    assert int(caught.value.exit_code) == 2


def test_a_label_with_control_characters_is_refused() -> None:
    with pytest.raises(UsageError, match=r"^--label .*: control character"):
        parse_run_options(["--label", "a\x1b[2Jb"])


def test_split_command() -> None:
    assert split_command(["-m", "1G", "--", "make", "-j"]) == (["-m", "1G"], ["make", "-j"])
    # Without "--", the first word that is not an option (nor an option's value) starts CMD.
    assert split_command(["-m", "1G", "--no-cap", "make", "-j"]) == (["-m", "1G", "--no-cap"],
                                                                     ["make", "-j"])
    assert split_command(["--peer", "-"]) == (["--peer"], ["-"])
    assert split_command(["--auto"]) == (["--auto"], [])
