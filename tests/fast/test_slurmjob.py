"""The slurm kind's pure parts: its settings, the srun command line, the wrapper's marker filter, how
an end state becomes an exit code, and how --mem is sized. No Slurm needed (the same paths run
against a real cluster in tests/cluster/test_slurm_run.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dispatch.config.model import validate_file
from dispatch.core.errors import ConfigError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.request import RunRequest
from dispatch.hosts.kinds import host_for
from dispatch.hosts.slurm.facts import duration_seconds
from dispatch.hosts.slurm.job import (
    MarkerFilter,
    job_mem,
    marker,
    mem_flag,
    srun_argv,
    submit_refusal,
    time_flag,
    verdict,
    wrapper_script,
)
from dispatch.hosts.slurm.keys import SlurmOptions, options_of
from dispatch.hosts.slurm.kind import SlurmHost

MiB, GiB = 1 << 20, 1 << 30
TOKEN = "0123456789abcdef"


def load(tmp_path: Path, body: str) -> object:
    path = tmp_path / "hosts.toml"
    path.write_text(body)
    return validate_file(str(path))


# ------------------------------------------------------------------------------------------ settings
def test_a_slurm_table_parses_into_its_options(tmp_path: Path) -> None:
    settings = load(tmp_path, "[hosts.farm]\nkind = 'slurm'\npartition = 'gpu'\naccount = 'ml'\n"
                              "qos = 'low'\nsrun_args = ['--constraint=a100', '--exclusive']\n"
                              "slurm_conf = '/etc/slurm/x.conf'\ndefault_cap = '8G'\nheavy_threads = 4\n"
                              "max_runtime = '2h'\n")
    host = host_for(settings, "farm")  # type: ignore[arg-type]
    assert isinstance(host, SlurmHost) and not host.is_here
    assert host.options == SlurmOptions(partition="gpu", account="ml", qos="low",
                                        srun_args=("--constraint=a100", "--exclusive"),
                                        slurm_conf="/etc/slurm/x.conf")
    assert (host.table.default_cap, host.table.heavy_threads, host.table.max_runtime) == (
        8 * GiB, 4, 7200.0)


@pytest.mark.parametrize(("body", "needle"), [
    ("slice = '8G'\n", "Slurm caps and places jobs on a cluster (slice is for hostrun's own runner"),
    ("gamble_size = '1G'\n", "(gamble_size is for hostrun's own runner"),
    ("backend = 'cgroup1'\n", "(backend is for hostrun's own runner"),
    ("peer_memory_cap = '8G'\n", "peer_memory_cap is not a key of kind slurm"),
    ("srun_args = '--exclusive'\n", "srun_args: Input should be a valid list"),
    ("srun_args = ['--x', 3]\n", "srun_args.1: Input should be a valid string"),
])
def test_a_bad_slurm_table_is_one_line(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, "[hosts.farm]\nkind = 'slurm'\n" + body)
    assert "\n" not in str(caught.value) and needle in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


def test_options_default_to_nothing() -> None:
    from dispatch.core.configfile import make_host
    from dispatch.hosts.slurm.keys import SPEC

    assert options_of(make_host("farm", SPEC)) == SlurmOptions()


# --------------------------------------------------------------------------------------- srun argv
def test_srun_argv_maps_the_request() -> None:
    request = RunRequest(argv=["make", "-C", "a b"], gpu_memory=8 * GiB)
    options = SlurmOptions(partition="gpu", account="ml", qos="low", srun_args=("--exclusive",))
    argv = srun_argv(request, options, label="proj:make", token=TOKEN, cap=3 * GiB + 1, threads=6,
                     max_runtime=61, cwd="/work/tree", stdin=False)
    script = wrapper_script(TOKEN, "/work/tree")  # the wrapper enters it too
    assert argv == ["srun", "--job-name=proj:make", f"--comment=hostrun:{TOKEN}", "--cpus-per-task=6",
                    "--chdir=/work/tree", "--mem=3073M", "--time=2", "--gres=gpu:1", "--partition=gpu",
                    "--account=ml", "--qos=low", "--input=none", "--exclusive",
                    "sh", "-c", script, "make", "make", "-C", "a b"]


def test_srun_argv_leaves_out_what_is_not_asked() -> None:
    argv = srun_argv(RunRequest(argv=["true"]), SlurmOptions(), label="t", token=TOKEN, cap=None,
                     threads=1, max_runtime=None, cwd="/", stdin=True)
    assert not [a for a in argv if a.startswith(("--mem", "--time", "--gres", "--partition",
                                                 "--input"))]


@pytest.mark.parametrize(("cap", "flag"), [(MiB, "--mem=1M"), (MiB + 1, "--mem=2M"),
                                           (8 * GiB, "--mem=8192M")])
def test_mem_is_whole_mib_rounded_up(cap: int, flag: str) -> None:
    assert mem_flag(cap) == flag


@pytest.mark.parametrize(("seconds", "flag"), [(1, "--time=1"), (60, "--time=1"), (61, "--time=2"),
                                               (5400, "--time=90")])
def test_time_is_whole_minutes_rounded_up(seconds: float, flag: str) -> None:
    assert time_flag(seconds) == flag


def test_the_wrapper_runs_the_job_untouched_and_reports_last(tmp_path: Path) -> None:
    """The wrapper under a real ``sh`` outside Slurm: the job's argv, stdin, stdout and exit status
    pass through; its one stderr line (job id, peak: empty without a cgroup file) comes after."""
    script = wrapper_script(TOKEN)
    argv = ["sh", "-c", script, "python3", "python3", "-c",
            "import sys; print(sys.argv[1:]); sys.stdout.write(sys.stdin.read());"
            " sys.stderr.write('err'); sys.exit(5)", "a b", "$(x)", ";"]
    done = subprocess.run(argv, input=b"in\n", capture_output=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42"})
    assert done.returncode == 5
    assert done.stdout == b"['a b', '$(x)', ';']\nin\n"
    assert done.stderr.startswith(b"err" + marker(TOKEN) + b"42:")
    filt = MarkerFilter(TOKEN)
    assert filt.feed(done.stderr) + filt.finish() == b"err"
    assert filt.reported()[0] == "42" and filt.status == 5


def test_the_wrapper_reports_a_command_the_node_lacks_and_runs_nothing() -> None:
    done = subprocess.run(["sh", "-c", wrapper_script(TOKEN), "no-such-cmd-x", "no-such-cmd-x"],
                          capture_output=True, check=False)
    assert done.returncode == 127
    filt = MarkerFilter(TOKEN)
    assert filt.feed(done.stderr) + filt.finish() == b""  # nothing of the shell's own
    assert filt.no_command and filt.status is None


def test_the_wrapper_says_nothing_of_its_own_for_a_job_a_signal_killed() -> None:
    done = subprocess.run(["sh", "-c", wrapper_script(TOKEN), "sh", "sh", "-c", "kill -TERM $$"],
                          capture_output=True, check=False)
    assert done.returncode == 143
    filt = MarkerFilter(TOKEN)
    assert filt.feed(done.stderr) + filt.finish() == b""  # no "Terminated"
    assert filt.status == 143


# ----------------------------------------------------------------------------------- marker filter
STREAM = b"job says \x1fnot a mark\nmore" + marker(TOKEN) + b"17:123456\nsrun: error: x\n"


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_the_marker_is_taken_out_wherever_the_chunks_split(cut: int) -> None:
    filt = MarkerFilter(TOKEN)
    out = filt.feed(STREAM[:cut]) + filt.feed(STREAM[cut:]) + filt.finish()
    assert out == b"job says \x1fnot a mark\nmoresrun: error: x\n"
    assert filt.reported() == ("17", 123456)


def test_byte_by_byte_and_without_a_marker() -> None:
    filt = MarkerFilter(TOKEN)
    out = b"".join(filt.feed(STREAM[i:i + 1]) for i in range(len(STREAM))) + filt.finish()
    assert out == b"job says \x1fnot a mark\nmoresrun: error: x\n" and filt.reported() == ("17", 123456)
    other = MarkerFilter("f" * 16)  # another run's token is just text
    assert other.feed(STREAM) + other.finish() == STREAM and other.reported() == (None, None)


def test_a_partial_marker_at_the_end_is_given_back() -> None:
    filt = MarkerFilter(TOKEN)
    tail = marker(TOKEN)[:5]
    assert filt.feed(b"abc" + tail) == b"abc"
    assert filt.finish() == tail


def test_an_empty_peak_is_none() -> None:
    filt = MarkerFilter(TOKEN)
    filt.feed(marker(TOKEN) + b"9:\n")
    assert filt.reported() == ("9", None)


# ---------------------------------------------------------------------------------------- verdicts
@pytest.mark.parametrize(("state", "srun", "code", "outcome"), [
    ("COMPLETED", 0, 0, "exit"),
    ("FAILED", 7, 7, "exit"),
    ("FAILED", 137, 137, "signal"),
    ("FAILED", 250, 250, "exit"),  # the job's own exit 250: no signal is numbered 122
    ("FAILED", 254, 254, "exit"),
    ("OUT_OF_MEMORY", 1, ExitCode.OWN_CAP, "own-cap"),
    ("TIMEOUT", 143, ExitCode.MAX_RUNTIME, "max-runtime"),
    ("DEADLINE", 143, ExitCode.MAX_RUNTIME, "max-runtime"),
    ("NODE_FAIL", 1, ExitCode.CONNECTION_LOST, "connection-lost"),
    ("BOOT_FAIL", 1, ExitCode.CONNECTION_LOST, "connection-lost"),
    ("PREEMPTED", 1, ExitCode.CONNECTION_LOST, "connection-lost"),
    ("CANCELLED", 143, 143, "signal"),
    (None, 3, 3, "exit"),
    (None, -9, 137, "signal"),
])
def test_end_states_become_exit_codes(state: str | None, srun: int, code: int, outcome: str) -> None:
    judged = verdict(state, srun)
    assert (judged.exit_code, judged.outcome) == (code, outcome)


def test_a_job_we_interrupted_exits_as_the_signal_says() -> None:
    assert verdict("CANCELLED", 1, 15, interrupted=2).exit_code == 130
    # ...unless Slurm ended it for a reason of its own first
    assert verdict("OUT_OF_MEMORY", 1, interrupted=2).exit_code == ExitCode.OWN_CAP


def test_an_unreadable_end_state_is_said() -> None:
    assert "could not be read" in (verdict(None, 0).message or "")


@pytest.mark.parametrize(("stderr", "code"), [
    ("srun: error: Memory specification can not be satisfied\nsrun: error: Unable to allocate "
     "resources: Requested node configuration is not available\n", ExitCode.NEVER_FITS),
    ("srun: error: invalid partition specified: nope\nsrun: error: Unable to allocate resources: "
     "Invalid partition name specified\n", ExitCode.USAGE),
    ("srun: error: Unable to allocate resources: Job violates accounting/QOS policy\n", ExitCode.NOT_RUN),
    ("srun: error: vm: task 0: Exited with exit code 1\n", None),
    ("", None),
])
def test_submit_refusals(stderr: str, code: int | None) -> None:
    judged = submit_refusal(stderr, "cluster c")
    assert (judged.exit_code if judged else None) == code
    if judged is not None:
        assert judged.message and "\n" not in judged.message and "cluster c" in judged.message


# ---------------------------------------------------------------------------------------- --mem
def test_mem_comes_from_the_cap_then_the_half_rule_then_default_cap() -> None:
    assert job_mem(3 * GiB, 10 * GiB, GiB) == (3 * GiB, "cap")
    assert job_mem(None, 100 * MiB, GiB) == (512 * MiB, "peak")
    assert job_mem(None, 700 * MiB, None) == (1536 * MiB, "peak")
    assert job_mem(None, None, GiB) == (GiB, "cap")
    assert job_mem(None, None, None) == (None, None)


@pytest.mark.parametrize(("text", "seconds"), [("00:00:00", 0.0), ("01:02:03", 3723.0), ("5:07", 307.0),
                                               ("2-00:00:01", 172801.0), ("UNLIMITED", None), ("", None),
                                               ("x-1:00", None)])
def test_slurm_durations(text: str, seconds: float | None) -> None:
    assert duration_seconds(text) == seconds


def test_within_nodes_cuts_the_half_rule_to_the_largest_node() -> None:
    from dispatch.hosts.slurm.job import within_nodes

    assert within_nodes(512 * MiB, 1024 * MiB) == (512 * MiB, None)
    assert within_nodes(512 * MiB, None) == (512 * MiB, None)
    size, note = within_nodes(2048 * MiB, 1024 * MiB)
    assert size == 1024 * MiB and note is not None and "largest node's 1.0 GiB" in note
