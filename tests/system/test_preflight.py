"""Preflight: a script's ``# admission:`` and ``# run-condition:`` headers, checked before booking.

End-to-end tests run the real CLI (``python -m dispatch``) against the ``hostrun`` fixture's own
config, state directory and real cgroup v1 slice; its teardown fails a test that leaves a process, a
job cgroup or a booking behind. "Nothing ran" is proved by a side-effect file the script would have
written (every script here appends a line to ``$LOG`` first thing), "nothing booked" by the ledger
and the slice not even existing yet in a fresh state directory.

GPU: FAKES, NOT A DRIVER. ``device gpu`` is checked against ``tests.support.gpus.FakeGpus``, a small
shell-script ``nvidia-smi`` put first on PATH that prints devices from a file the test writes; no
real GPU or driver is involved.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.errors import UsageError
from dispatch.local.run.preflight import Condition, Script, declared, fingerprint, path_digest
from tests.conftest import Hostrun, wait_for
from tests.support.gpus import FakeGpus

PY = sys.executable


def write_script(path: Path, headers: str, body: str = "") -> Path:
    """A /bin/sh script whose first command appends one line to $LOG (the proof that it ran)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n# a script under test\n{headers.strip()}\n\n"
                    f'echo "ran $*" >> "$LOG"\n{body}\n')
    path.chmod(0o755)
    return path


def env(log: Path, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("HOSTRUN_JOB", "MODE", "CUDA_VISIBLE_DEVICES")}
    e["LOG"] = str(log)
    e.update(extra)
    return e


def runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def preflight_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hostrun: preflight:")]


def assert_nothing_created(h: Hostrun) -> None:
    """A fresh state dir after a refusal: no ledger (nothing was booked), no slice, no job cgroup."""
    assert not (h.state_dir / "ledger.sqlite3").exists()
    assert not h.slice_dir.exists()


# ------------------------------------------------------------------------------ run-condition: command
def test_command_met_runs(hostrun: Hostrun, tmp_path: Path) -> None:
    log = tmp_path / "log"
    job = write_script(tmp_path / "job.sh", "# run-condition: command sh cat")
    proc = hostrun.run("-m", "64M", "--", str(job), env=env(log))
    assert proc.returncode == 0, proc.stderr
    assert runs(log) == 1
    assert preflight_lines(proc.stderr) == []


def test_command_unmet_is_78_nothing_run_nothing_booked(hostrun: Hostrun, tmp_path: Path) -> None:
    log = tmp_path / "log"
    job = write_script(tmp_path / "job.sh", "# run-condition: command sh no-such-tool-1 no-such-tool-2")
    proc = hostrun.run("-m", "64M", "--", str(job), env=env(log))
    assert proc.returncode == 78, proc.stderr
    assert runs(log) == 0
    assert preflight_lines(proc.stderr)[0] == (
        "hostrun: preflight: unmet: run-condition: command sh no-such-tool-1 no-such-tool-2 "
        "(not on PATH: no-such-tool-1, no-such-tool-2)")
    assert f"1 condition unmet for {job}; nothing ran" in proc.stderr
    assert "exit 78 (not-run)" in proc.stderr
    assert_nothing_created(hostrun)


def test_script_behind_an_interpreter_is_checked(hostrun: Hostrun, tmp_path: Path) -> None:
    log = tmp_path / "log"
    job = tmp_path / "job.py"
    job.write_text("# run-condition: command no-such-tool-3\n"
                   "import os\nopen(os.environ['LOG'], 'a').write('ran\\n')\n")
    proc = hostrun.run("-m", "64M", "--", PY, str(job), env=env(log))
    assert proc.returncode == 78
    assert "unmet: run-condition: command no-such-tool-3" in proc.stderr
    assert runs(log) == 0


def test_each_unmet_condition_on_its_own_line(hostrun: Hostrun, tmp_path: Path) -> None:
    log, empty = tmp_path / "log", tmp_path / "empty-bin"
    empty.mkdir()  # PATH: no nvidia-smi, no tools at all (the script needs only /bin/sh)
    job = write_script(tmp_path / "job.sh", "# run-condition: command git-nope\n"
                                            "# run-condition: device gpu\n"
                                            "# run-condition: min-free 100G\n"
                                            "# run-condition: single-instance\n")
    proc = hostrun.run("-m", "64M", "--", str(job), env=env(log, PATH=str(empty)))
    assert proc.returncode == 78
    assert preflight_lines(proc.stderr) == [
        "hostrun: preflight: unmet: run-condition: command git-nope (not on PATH: git-nope)",
        "hostrun: preflight: unmet: run-condition: device gpu (no GPU: nvidia-smi is not on PATH)",
        "hostrun: preflight: unmet: run-condition: min-free 100G (slice room now 300 MiB, need 100.0 GiB)",
        f"hostrun: preflight: 3 conditions unmet for {job}; nothing ran",
    ]
    assert runs(log) == 0


def test_result_file_says_not_run(hostrun: Hostrun, tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "r.json"
    job = write_script(tmp_path / "job.sh", "# run-condition: command no-such-tool-4")
    proc = hostrun.run("-m", "64M", "--result-file", str(out), "--", str(job), env=env(log))
    assert proc.returncode == 78
    r = json.loads(out.read_text())
    assert r["exit_code"] == 78 and r["outcome"] == "not-run" and r["argv"] == [str(job)]
    assert "1 condition unmet" in r["message"] and r["booked_bytes"] is None


# -------------------------------------------------------------------------- run-condition: device gpu
def test_device_gpu_with_a_fake_nvidia_smi(hostrun: Hostrun, tmp_path: Path) -> None:
    """FAKE nvidia-smi (tests.support.gpus.FakeGpus): no real GPU is involved."""
    fake = FakeGpus(tmp_path)
    log = tmp_path / "log"
    job = write_script(tmp_path / "job.sh", "# run-condition: device gpu")
    fake.set((16384, 0, 16384))
    proc = hostrun.run("-m", "64M", "--", str(job), env=fake.env(LOG=str(log)))
    assert proc.returncode == 0, proc.stderr
    assert runs(log) == 1
    fake.set()  # nvidia-smi answers, but lists no device
    proc = hostrun.run("-m", "64M", "--", str(job), env=fake.env(LOG=str(log)))
    assert proc.returncode == 78
    assert "unmet: run-condition: device gpu (no GPU: nvidia-smi lists no GPU)" in proc.stderr
    fake.set((16384, 0, 16384))
    proc = hostrun.run("-m", "64M", "--", str(job), env=fake.env(LOG=str(log), CUDA_VISIBLE_DEVICES="-1"))
    assert proc.returncode == 78
    assert "CUDA_VISIBLE_DEVICES='-1' hides all 1 GPU(s)" in proc.stderr
    (fake.bin / "fail").write_text("NVIDIA-SMI has failed because it couldn't communicate with the "
                                   "NVIDIA driver.\n")
    proc = hostrun.run("-m", "64M", "--", str(job), env=fake.env(LOG=str(log)))
    assert proc.returncode == 78
    assert "cannot read the GPUs: nvidia-smi failed (exit 9)" in proc.stderr
    assert runs(log) == 1


# ---------------------------------------------------------------------------- run-condition: min-free
def test_min_free_met_and_unmet_while_a_holder_runs(hostrun: Hostrun, tmp_path: Path) -> None:
    log, started = tmp_path / "log", tmp_path / "started"
    big = write_script(tmp_path / "big.sh", "# run-condition: min-free 200M")
    small = write_script(tmp_path / "small.sh", "# run-condition: min-free 100M")
    proc = hostrun.run("-m", "64M", "--", str(big), env=env(log))
    assert proc.returncode == 0, proc.stderr  # the 300M slice is empty
    holder = hostrun.popen("-m", "150M", "--label", "holder", "--", "sh", "-c",
                           f"touch {started}; exec sleep 60")
    try:
        wait_for(started.exists)
        proc = hostrun.run("-m", "64M", "--", str(big), env=env(log))
        assert proc.returncode == 78
        assert ("unmet: run-condition: min-free 200M (slice room now 150 MiB, need 200 MiB)"
                in proc.stderr)
        assert runs(log) == 1
        proc = hostrun.run("-m", "64M", "--", str(small), env=env(log))
        assert proc.returncode == 0, proc.stderr
        assert runs(log) == 2
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)


# --------------------------------------------------------------------- run-condition: single-instance
def test_single_instance_two_concurrent_runs(hostrun: Hostrun, tmp_path: Path) -> None:
    log, release = tmp_path / "log", tmp_path / "release"
    job = write_script(tmp_path / "job.sh", "# run-condition: single-instance",
                       'while [ ! -f "$RELEASE" ]; do sleep 0.05; done')
    e = env(log, RELEASE=str(release))
    first = hostrun.popen("-m", "64M", "--", str(job), "one", env=e)
    try:
        wait_for(lambda: runs(log) == 1, timeout=20)
        second = hostrun.run("-m", "64M", "--", str(job), "two", env=e)
        assert second.returncode == 78
        assert (f"unmet: run-condition: single-instance (another instance is running: hostrun pid "
                f"{first.pid} since ") in second.stderr
        assert str(job) in second.stderr
        dry = hostrun.run("preflight", str(job), env=e)  # the dry run sees it too, takes nothing
        assert dry.returncode == 78 and "UNMET" in dry.stdout and f"pid {first.pid}" in dry.stdout
        assert log.read_text() == "ran one\n"
    finally:
        release.touch()
        assert first.wait(timeout=30) == 0
    third = hostrun.run("-m", "64M", "--", str(job), "three", env=e)
    assert third.returncode == 0, third.stderr
    assert log.read_text() == "ran one\nran three\n"
    lock_files = list((hostrun.state_dir / "preflight").glob("*.lock"))
    assert len(lock_files) == 1 and stat.S_IMODE(lock_files[0].stat().st_mode) == 0o600


def test_single_instance_lock_goes_with_a_sigkilled_holder(hostrun: Hostrun, tmp_path: Path) -> None:
    log, release = tmp_path / "log", tmp_path / "release"
    job = write_script(tmp_path / "job.sh", "# run-condition: single-instance",
                       'while [ ! -f "$RELEASE" ]; do sleep 0.05; done')
    e = env(log, RELEASE=str(release))
    first = hostrun.popen("-m", "64M", "--", str(job), env=e)
    wait_for(lambda: runs(log) == 1, timeout=20)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    # Its guardian empties the job's cgroup and releases the booking; the lock goes with them.
    wait_for(lambda: hostrun.bookings() == [] and hostrun.job_dirs() == [], timeout=10)
    release.touch()
    proc = hostrun.run("-m", "64M", "--", str(job), env=e)
    assert proc.returncode == 0, proc.stderr
    assert runs(log) == 2


def test_single_instance_script_may_call_preflight_on_itself(hostrun: Hostrun, tmp_path: Path) -> None:
    """The reference's pattern: the script asks preflight first. Under the hostrun that holds the
    lock for it, its own check is met (the holder is its ancestor), not refused."""
    log, out = tmp_path / "log", tmp_path / "inner.txt"
    job = write_script(tmp_path / "job.sh", "# run-condition: single-instance",
                       f'"{PY}" -m dispatch --config "{hostrun.config_path}" preflight "$0" > "{out}"\n'
                       f'echo "rc=$?" >> "{out}"')
    proc = hostrun.run("-m", "200M", "--", str(job), env=env(log))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "would run" in text and "held by this run's own hostrun" in text and "rc=0" in text


# ------------------------------------------------------------------------- admission: inputs-changed
def make_project(tmp_path: Path) -> tuple[Path, Path]:
    proj = tmp_path / "proj"
    (proj / "data" / "sub").mkdir(parents=True)
    (proj / "data" / "a.txt").write_text("alpha\n")
    (proj / "data" / "sub" / "b.txt").write_text("bravo\n")
    (proj / "config.txt").write_text("threads = 4\n")
    job = write_script(proj / "scripts" / "job.sh",
                       "# admission: inputs-changed ../data ../config.txt env:MODE",
                       'exit "${FAIL:-0}"')
    return proj, job


def test_inputs_unchanged_second_run_skipped_third_after_change_runs(hostrun: Hostrun,
                                                                     tmp_path: Path) -> None:
    proj, job = make_project(tmp_path)
    log, elsewhere = tmp_path / "log", tmp_path / "elsewhere"
    elsewhere.mkdir()  # relative input paths are relative to the script's directory, not the cwd
    first = hostrun.run("-m", "64M", "--", str(job), env=env(log), cwd=elsewhere)
    assert first.returncode == 0, first.stderr
    second = hostrun.run("-m", "64M", "--", str(job), env=env(log), cwd=elsewhere)
    assert second.returncode == 78
    assert runs(log) == 1
    lines = preflight_lines(second.stderr)
    assert len(lines) == 1  # a skip is said in one line (plus hostrun's usual "exit 78" line)
    assert lines[0].startswith(f"hostrun: preflight: nothing to do for {job}: admission: inputs-changed "
                               "../data ../config.txt env:MODE: unchanged since the last successful run at ")
    assert lines[0].endswith("; nothing ran (--force runs it anyway)")
    # Same size, mtime put back: the content is hashed, not the metadata.
    b = proj / "data" / "sub" / "b.txt"
    st = b.stat()
    b.write_text("BRAVO\n")
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    third = hostrun.run("-m", "64M", "--", str(job), env=env(log), cwd=elsewhere)
    assert third.returncode == 0, third.stderr
    assert runs(log) == 2
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 78
    (proj / "config.txt").write_text("threads = 8\n")
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 0
    (proj / "data" / "new.txt").write_text("")  # a new, empty file counts
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 0
    (proj / "data" / "new.txt").unlink()  # and so does a removed one
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 0
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 78
    assert runs(log) == 5


def test_inputs_env_change(hostrun: Hostrun, tmp_path: Path) -> None:
    _, job = make_project(tmp_path)
    log = tmp_path / "log"
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 0
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 78
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log, MODE="")).returncode == 0  # unset → set
    fast = hostrun.run("-m", "64M", "--", str(job), env=env(log, MODE="fast"))
    assert fast.returncode == 0
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log, MODE="fast")).returncode == 78
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log, OTHER="x", MODE="fast")).returncode == 78
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log, MODE="slow")).returncode == 0
    assert runs(log) == 4
    dry = hostrun.run("preflight", "--json", str(job), env=env(log, MODE="fast"))
    assert dry.returncode == 0
    assert json.loads(dry.stdout)["conditions"][0]["detail"].endswith(": env:MODE")


def test_only_a_success_is_recorded(hostrun: Hostrun, tmp_path: Path) -> None:
    _, job = make_project(tmp_path)
    log = tmp_path / "log"
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log, FAIL="3")).returncode == 3
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 0  # still due
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 78
    assert runs(log) == 2


def test_records_are_per_arguments_private_and_hold_no_values(hostrun: Hostrun, tmp_path: Path) -> None:
    _, job = make_project(tmp_path)
    log = tmp_path / "log"
    secret = "s3cret-token-value"
    for arg in ("debug", "release"):
        assert hostrun.run("-m", "64M", "--", str(job), arg, env=env(log, MODE=secret)).returncode == 0
    assert hostrun.run("-m", "64M", "--", str(job), "debug", env=env(log, MODE=secret)).returncode == 78
    assert runs(log) == 2
    state = hostrun.state_dir / "preflight"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    records = sorted(state.glob("*.json"))
    assert len(records) == 2
    for path in records:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        text = path.read_text()
        assert secret not in text
        data = json.loads(text)
        assert data["script"] == os.path.realpath(job) and data["args"] in (["debug"], ["release"])
        assert set(data["inputs"]) == {"../data", "../config.txt", "env:MODE"}


def test_force_overrides_admission_never_run_conditions(hostrun: Hostrun, tmp_path: Path) -> None:
    _, job = make_project(tmp_path)
    log = tmp_path / "log"
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 0
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 78
    forced = hostrun.run("-m", "64M", "--force", "--", str(job), env=env(log))
    assert forced.returncode == 0, forced.stderr
    assert "running anyway (--force)" in forced.stderr
    assert runs(log) == 2
    gated = write_script(tmp_path / "gated.sh", "# admission: inputs-changed gated.sh\n"
                                                "# run-condition: command no-such-tool-5")
    proc = hostrun.run("-m", "64M", "--force", "--", str(gated), env=env(log))
    assert proc.returncode == 78
    assert "unmet: run-condition: command no-such-tool-5" in proc.stderr
    assert runs(log) == 2


def test_nested_hostrun_checks_and_records_too(hostrun: Hostrun, tmp_path: Path) -> None:
    """Inside a hostrun job, the inner hostrun does not book again, but still applies the headers."""
    _, job = make_project(tmp_path)
    log = tmp_path / "log"
    inner = [PY, "-m", "dispatch", "--config", str(hostrun.config_path), "--", str(job)]
    first = hostrun.run("-m", "200M", "--", *inner, env=env(log))
    assert first.returncode == 0, first.stderr
    second = hostrun.run("-m", "200M", "--", *inner, env=env(log))
    assert second.returncode == 78  # the inner 78, passed through by the outer job
    assert "nothing to do for" in second.stderr
    assert runs(log) == 1


# ------------------------------------------------------------------------------ malformed headers
MALFORMED = [
    ("# run-condition: frobnicate", "run-condition: unknown condition 'frobnicate' (known: command, "
                                    "single-instance, device, min-free)"),
    ("# run-condition:", "run-condition: nothing declared"),
    ("# run-condition: command", "command needs at least one TOOL"),
    ("# run-condition: min-free lots", "min-free: not a size: 'lots'"),
    ("# run-condition: min-free", "min-free needs exactly one SIZE"),
    ("# run-condition: device tpu", "device needs exactly one of: gpu (got 'tpu')"),
    ("# run-condition: device", "device needs exactly one of: gpu"),
    ("# run-condition: single-instance please", "single-instance takes no argument"),
    ("# admission: always", "admission: unknown admission kind 'always' (known: inputs-changed)"),
    ("# admission: inputs-changed", "inputs-changed needs at least one PATH or env:VAR"),
    ("# admission: inputs-changed env:1BAD", "'env:1BAD' is not an environment variable name"),
    ('# admission: inputs-changed "src', "No closing quotation"),
]


@pytest.mark.parametrize(("header", "message"), MALFORMED)
def test_malformed_header_is_2_naming_the_line(hostrun: Hostrun, tmp_path: Path, header: str,
                                               message: str) -> None:
    log = tmp_path / "log"
    job = write_script(tmp_path / "job.sh", f"# run-condition: command sh\n{header}")
    proc = hostrun.run("-m", "64M", "--", str(job), env=env(log))
    assert proc.returncode == 2
    assert f"hostrun: error: {job}:4: " in proc.stderr and message in proc.stderr
    assert runs(log) == 0
    dry = hostrun.run("preflight", str(job), env=env(log))
    assert dry.returncode == 2 and f"{job}:4: " in dry.stderr and message in dry.stderr


def test_unrelated_headers_and_later_lines_are_not_conditions(tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n# long-job: sharded\n# Run-Condition: command sh\necho hi\n"
                   "# run-condition: frobnicate\n")
    script = declared([str(job), "x"])
    assert script is not None and script.args == ("x",)
    assert [(c.line, c.header, c.kind, c.args) for c in script.conditions] == [
        (3, "run-condition", "command", ("sh",))]
    assert declared(["sh", "-c", "echo # run-condition: frobnicate"]) is None
    job.write_text("#!/bin/sh\n# long-job: sharded\n")
    assert declared([str(job)]) is None


def test_admission_lines_merge(tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n# admission: inputs-changed a\n# run-condition: single-instance\n"
                   "# admission: inputs-changed env:B 'c d'\n")
    script = declared(["bash", str(job)])
    assert script is not None
    assert script.conditions[0] == Condition(2, "admission", "inputs-changed", ("a", "env:B", "c d"))
    with pytest.raises(UsageError, match=r"job\.sh:2: admission: unknown admission kind 'sometimes'"):
        job.write_text("#!/bin/sh\n# admission: sometimes\n")
        declared([str(job)])


# ------------------------------------------------------------------------------------- fingerprint
def test_directory_digest_is_deterministic_and_sees_names_kinds_and_links(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / "x").mkdir(parents=True)
    (d / "x" / "f").write_text("1")
    (d / "g").write_text("2")
    first = path_digest(str(d))
    assert path_digest(str(d)) == first and len(first) == 64
    (d / "x" / "f").rename(d / "x" / "h")  # a rename, same content
    renamed = path_digest(str(d))
    assert renamed != first
    (d / "empty").mkdir()  # an empty directory appears
    with_dir = path_digest(str(d))
    assert with_dir != renamed
    os.symlink("g", d / "link")
    linked = path_digest(str(d))
    assert linked != with_dir
    (d / "link").unlink()
    os.symlink("x", d / "link")  # the same link name, another target
    assert path_digest(str(d)) not in (linked, with_dir)
    assert path_digest(str(tmp_path / "absent")) == "missing"
    assert path_digest(str(d / "g")) != path_digest(str(d / "x" / "h"))


def test_fingerprint_relative_to_the_script_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "in.txt").write_text("v1")
    cond = Condition(2, "admission", "inputs-changed", ("in.txt", "env:V"))
    script = Script(str(tmp_path / "s" / "job.sh"), (), (cond,))
    monkeypatch.chdir(tmp_path)
    got = fingerprint(script, cond, {"V": "x"})
    assert got["in.txt"] == path_digest(str(tmp_path / "s" / "in.txt")) != "missing"
    assert got["env:V"] != fingerprint(script, cond, {})["env:V"] == "unset"
    assert fingerprint(script, cond, {"V": ""})["env:V"] != "unset"


# --------------------------------------------------------------------------------- hostrun preflight
def test_preflight_dry_run_text_and_json(hostrun: Hostrun, tmp_path: Path) -> None:
    _, job = make_project(tmp_path)
    log = tmp_path / "log"
    dry = hostrun.run("preflight", str(job), env=env(log))
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0] == f"{job}: would run"
    assert lines[1] == ("  met    line 3: admission: inputs-changed ../data ../config.txt env:MODE — "
                        "no successful run recorded yet")
    assert runs(log) == 0
    again = hostrun.run("preflight", "--json", str(job), "debug", env=env(log))
    assert again.returncode == 0  # a dry run records nothing
    data = json.loads(again.stdout)
    assert data["would_run"] is True and data["nothing_to_do"] is False and data["exit_code"] == 0
    assert data["script"] == str(job) and data["args"] == ["debug"]
    assert data["conditions"] == [{
        "line": 3, "header": "admission", "kind": "inputs-changed",
        "args": ["../data", "../config.txt", "env:MODE"],
        "text": "admission: inputs-changed ../data ../config.txt env:MODE", "met": True,
        "detail": "no successful run recorded yet"}]
    assert hostrun.run("-m", "64M", "--", str(job), env=env(log)).returncode == 0
    skipped = hostrun.run("preflight", str(job), env=env(log))
    assert skipped.returncode == 78
    assert skipped.stdout.startswith(f"{job}: nothing to do, would not run (exit 78)")
    skipped_json = json.loads(hostrun.run("preflight", "--json", str(job), env=env(log)).stdout)
    assert skipped_json["nothing_to_do"] is True and skipped_json["would_run"] is False
    assert skipped_json["exit_code"] == 78 and skipped_json["conditions"][0]["met"] is False
    forced = hostrun.run("preflight", "--force", str(job), env=env(log))
    assert forced.returncode == 0 and "would run (--force: its inputs are unchanged)" in forced.stdout
    assert runs(log) == 1


def test_preflight_dry_run_unmet_plain_and_usage(hostrun: Hostrun, tmp_path: Path) -> None:
    log = tmp_path / "log"
    job = write_script(tmp_path / "job.sh", "# run-condition: command sh no-such-tool-6\n"
                                            "# run-condition: min-free 1M")
    dry = hostrun.run("preflight", "--", str(job), env=env(log))
    assert dry.returncode == 78
    assert dry.stdout.splitlines() == [
        f"{job}: would not run (exit 78): 1 condition unmet",
        "  UNMET  line 3: run-condition: command sh no-such-tool-6 — not on PATH: no-such-tool-6",
        "  met    line 4: run-condition: min-free 1M — slice room now 300 MiB, need 1 MiB",
    ]
    plain = write_script(tmp_path / "plain.sh", "# nothing declared here")
    proc = hostrun.run("preflight", "--json", str(plain))
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["conditions"] == [] and json.loads(proc.stdout)["would_run"] is True
    text = hostrun.run("preflight", str(plain))
    assert text.stdout.strip() == f"{plain}: would run (it declares no preflight condition)"
    missing = hostrun.run("preflight", str(tmp_path / "nope.sh"))
    assert missing.returncode == 2 and "is not a script file" in missing.stderr
    assert hostrun.run("preflight").returncode == 2
    assert hostrun.run("preflight", "--bogus", str(plain)).returncode == 2
    assert runs(log) == 0


def test_plain_commands_do_not_load_preflight(hostrun: Hostrun, tmp_path: Path) -> None:
    """The hot path: for a command that is not a script with these headers, hostrun reads at most a
    candidate script's first bytes; dispatch.local.run.preflight (and the json/shlex it needs) stay
    unloaded."""
    plain = write_script(tmp_path / "plain.sh", "# long-job: sharded")
    code = ("import sys\n"
            "from dispatch.cli.main import main\n"
            f"codes = [main(['--config', {str(hostrun.config_path)!r}, '-m', '64M', '--', *argv])\n"
            f"         for argv in (['true'], ['sh', '-c', 'true'], [{str(plain)!r}])]\n"
            "print(codes, sorted(m for m in ('dispatch.local.run.preflight', 'json', 'shlex')"
            " if m in sys.modules))\n")
    import subprocess

    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                         env=env(tmp_path / "log"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 0, 0] []"
    assert runs(tmp_path / "log") == 1


# ------------------------------------------------------------------------------------------ on a peer
def test_on_a_peer_the_peer_checks_and_records_and_force_travels(hostrun: Hostrun, peers: Any,
                                                                 tmp_path: Path) -> None:
    """With --peer the headers are checked where the job runs: the peer's agent, its state dir (a
    real sshd peer on 127.0.0.2 with its own config, ledger and slice; tests/system/test_peer_run.py)."""
    from tests.support.peers import setup

    peer, tree = setup(hostrun, peers, tmp_path)
    job = tree / "job.sh"
    job.write_text('#!/bin/sh\n# admission: inputs-changed src\n# run-condition: command sh\n'
                   'echo "ran on $(pwd)"\n')
    job.chmod(0o755)
    first = hostrun.run("--peer", "-m", "64M", "--", "./job.sh", cwd=tree)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("ran on ")
    second = hostrun.run("--peer", "-m", "64M", "--", "./job.sh", cwd=tree)
    assert second.returncode == 78, second.stderr
    assert "nothing to do for ./job.sh" in second.stderr and second.stdout == ""
    forced = hostrun.run("--peer", "-m", "64M", "--force", "--", "./job.sh", cwd=tree)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith("ran on ")
    assert len(list((peer.state_dir / "preflight").glob("*.json"))) == 1
    assert not (hostrun.state_dir / "preflight").exists()  # nothing checked or recorded here
