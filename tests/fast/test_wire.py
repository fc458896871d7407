"""The wire records of ``hostrun --peer`` (``dispatch.agent.wire``), without a peer: what the controller
encodes, the agent decodes to the same request, through JSON as on the wire."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.agent.frames import Frame, encode
from dispatch.agent.wire import CARRIED, RunSpec, error_result, outcome_of, result_of
from dispatch.core.errors import OverPeerCapError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.outcome import Outcome
from dispatch.core.request import RunRequest
from dispatch.local.admission.booking import default_label

ROOT = Path(__file__).resolve().parents[2]
# Not UTF-8, a NUL-free control byte, a lone surrogate-escaped byte, a shell metacharacter, and 2 MiB.
ARGV = [os.fsdecode(b"caf\xe9"), os.fsdecode(b"\xff\xfe"), "tab\there", "$(rm -rf /)", "a" * (2 << 20)]


def _full_spec() -> RunSpec:
    """Every field set to something other than its default."""
    request = RunRequest(argv=ARGV, label="build", cap=3 << 30, max_runtime=90.5, threads=3,
                         no_cap=True, session="s-1", gpu_memory=1 << 30, force=True, group="cargo",
                         when_idle=True, requeue=True)
    return RunSpec(request=request, cwd="~/hostrun-work/tree-abc/sub", cap_if_none=4 << 30, stdin=True,
                   fallback={"slice_limit": "8GiB"}, prepare={"probes": ["cc --version"],
                                                              "sync_mark": "0123"},
                   alert_wait_after=600.0, status_interval=30.0)


def test_spec_round_trips_through_json_with_non_utf8_arguments() -> None:
    spec = _full_spec()
    text = json.dumps(spec.to_dict())  # would raise on a lone surrogate if argv went as text
    back = RunSpec.from_dict(json.loads(text))
    assert back == spec
    assert all(getattr(spec, name) != default for name, default in RunSpec._field_defaults.items())
    assert [os.fsencode(arg) for arg in back.request.argv][:2] == [b"caf\xe9", b"\xff\xfe"]


def test_every_request_field_but_argv_and_env_travels() -> None:
    """``role`` stays too: a peer runs jobs, never an agent session (``hostrun session`` is local)."""
    assert set(CARRIED) == set(RunRequest._fields) - {"argv", "env", "role"}
    full = _full_spec().request
    defaults = RunRequest._field_defaults
    assert all(getattr(full, name) != defaults[name] for name in CARRIED)  # the round trip proves each


def test_the_environment_stays_on_the_controller() -> None:
    spec = RunSpec(request=RunRequest(argv=["env"], env={"SECRET": "x"}), cwd="~")
    data = json.loads(json.dumps(spec.to_dict()))
    assert "env" not in data
    assert RunSpec.from_dict(data).request.env is None


def test_spec_keeps_its_json_shape() -> None:
    """The keys an agent of this tree reads: a rename shows here, not as a peer-run failure."""
    assert set(_full_spec().to_dict()) == {
        "argv_b64", "cwd", "label", "cap", "cap_if_none", "max_runtime", "threads", "no_cap",
        "session", "gpu_memory", "stdin", "force", "group", "when_idle", "requeue", "fallback", "prepare",
        "alert_wait_after", "status_interval"}


def test_result_round_trips_with_host_and_argv_from_the_controller() -> None:
    request = RunRequest(argv=ARGV, label="build")
    sent = Outcome(exit_code=ExitCode.OWN_CAP, outcome="own-cap", host="local", label="build",
                   argv=ARGV, cap_bytes=1 << 30, booking_kind="cap", booked_bytes=1 << 30,
                   peak_bytes=(1 << 30) - 4096, hit_ceiling=True, duration_s=1.5, waited_s=0.25,
                   backend="v1", cgroup="/hostrun/job-1", counters={"oom_kill": 1}, message="m",
                   gpu_index=0, gpu_bytes=1 << 20, vram_evidence=None)
    result = json.loads(json.dumps(result_of(sent)))
    assert "argv" not in result  # it may be megabytes: over a frame's limit
    got = outcome_of(result, "peer1", request)
    assert got.to_dict() == {**sent.to_dict(), "host": "peer1"}
    assert got.argv is not ARGV and got.argv == ARGV


@pytest.mark.parametrize("label", ["build", None])
def test_a_peer_never_chooses_the_label_the_controller_records(label: str | None) -> None:
    """The label keys this host's history and alerts: an R frame from a compromised peer that names
    another label (to overwrite its peaks, or to raise alerts under it) is recorded under the
    controller's own: the one asked for, or the argv's default label as a local run would use."""
    request = RunRequest(argv=ARGV, label=label)
    sent = Outcome(exit_code=0, outcome="exit", host="local", label="victim-label", argv=ARGV,
                   peak_bytes=1 << 40)
    got = outcome_of(json.loads(json.dumps(result_of(sent))), "peer1", request)
    assert got.label == (label or default_label(ARGV))


def test_error_result_carries_the_errors_exit_code() -> None:
    result = json.loads(json.dumps(error_result(OverPeerCapError("too big"))))
    got = outcome_of(result, "peer1", RunRequest(argv=["make"], label=None))
    assert (got.exit_code, got.outcome, got.message, got.label) == (
        ExitCode.OVER_PEER_CAP, "over-peer-cap", "too big", default_label(["make"]))
    other = outcome_of(error_result(RuntimeError("boom")), "peer1", RunRequest(argv=["make"]))
    assert (other.exit_code, other.outcome, other.message) == (1, "error", "boom")


def test_agent_refuses_a_spec_no_controller_sends() -> None:
    """One line and exit 2, no traceback: a spec without its arguments."""
    spec = _full_spec().to_dict()
    del spec["argv_b64"]
    proc = subprocess.run([sys.executable, "-c", "import sys; from dispatch.agent.main import main; "
                           "sys.exit(main(['run']))"],
                          input=encode(Frame.SPEC, json.dumps(spec).encode()), capture_output=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == ["agent: no run spec: 'argv_b64'"]
