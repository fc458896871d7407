"""What a label's record decides for the runs agents start (issue 21, item 9): the long-job rule
(244) through ``--long-job-rule``, which the hooks' rewrite and the shims add, and a GPU command's
VRAM booking from the label's recorded VRAM peak (``--gpu-memory auto``).

FAKES, NOT A DRIVER, for the VRAM half: these machines have no GPU. ``nvidia-smi`` is the fake of
tests/system/test_gpu.py, whose per-process answer (``--query-compute-apps``) the job itself writes with its
own pid, as a CUDA process would show there; what is real is the run, its cgroup's pid list, the
sampling thread, the ledger and its journal. The long-job half is all real (real runs, real ledger).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

from dispatch.core.exitcodes import ExitCode
from dispatch.local.admission.ledger import Ledger
from dispatch.local.store import peakjournal
from dispatch.placement.labelrules import vram_booking
from tests.conftest import Hostrun
from tests.support.claude import ROOT, event, real_hook
from tests.support.gpus import FakeGpus
from tests.support.shimtools import env_with, fake_tools, install, sh

MiB, GiB = 1 << 20, 1 << 30
LONG = "--long-job=sharded=per crate;resumable=checkpoints;multi-host=two boxes"


def record(hostrun: Hostrun, label: str, duration: float, vram: int | None = None) -> None:
    """A run of ``label`` in this host's ledger, as hostrun records one (the real ledger API)."""
    ledger = Ledger(str(hostrun.state_dir))
    try:
        ledger.record_peak(label, "local", 64 * MiB, False, duration, cap=None, vram=vram)
    finally:
        ledger.close()


def peak_row(hostrun: Hostrun, label: str) -> tuple[object, ...] | None:
    con = sqlite3.connect(hostrun.state_dir / "ledger.sqlite3", timeout=30)
    try:
        row: tuple[object, ...] | None = con.execute(
            "SELECT max_vram, max_duration FROM peaks WHERE label = ?", (label,)).fetchone()
        return row
    finally:
        con.close()


# -------------------------------------------------------------------- the long-job rule, run here
def test_long_job_rule_refuses_a_label_recorded_long_and_a_plain_run_does_not(
        hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(top='long_job_threshold = "1s"')
    assert hostrun.run("-m", "64M", "--label", "slow", "--", "sleep", "1.3").returncode == 0
    ran = tmp_path / "ran"
    out = tmp_path / "r.json"
    refused = hostrun.run("-m", "64M", "--label", "slow", "--long-job-rule", "--result-file", str(out),
                          "--", "touch", str(ran))
    assert refused.returncode == ExitCode.LONG_SINGLE_HOST, refused.stderr
    assert "expected duration 1." in refused.stderr and "(recorded on local)" in refused.stderr
    assert "lacks sharded, resumable, multi-host" in refused.stderr
    assert refused.stderr.startswith("hostrun: error: expected duration")
    assert refused.stderr.count("\n") == 1
    assert not ran.exists() and hostrun.bookings() == []
    written = json.loads(out.read_text())
    assert written["exit_code"] == 244 and written["label"] == "slow"
    # declared long: it runs; a plain run (no --long-job-rule) never gives 244
    assert hostrun.run("-m", "64M", "--label", "slow", "--long-job-rule", LONG, "--",
                       "touch", str(ran)).returncode == 0
    assert ran.exists()
    assert hostrun.run("-m", "64M", "--label", "slow", "--", "true").returncode == 0
    # a label with no history is judged by its declared duration, and a short one passes
    fresh = hostrun.run("-m", "64M", "--label", "fresh", "--long-job-rule", "--expect-duration", "3h",
                        "--", "true")
    assert fresh.returncode == 244 and "expected duration 3.0 h (declared)" in fresh.stderr
    assert hostrun.run("-m", "64M", "--label", "other", "--long-job-rule", "--", "true").returncode == 0


def test_long_job_rule_does_not_refuse_a_run_nested_in_a_job(hostrun: Hostrun) -> None:
    """The job around it was admitted as it is: a build step inside it is not a new long job."""
    hostrun.configure(top='long_job_threshold = "1s"')
    record(hostrun, "inner", 7200.0)
    inner = " ".join(hostrun.argv("--label", "inner", "--long-job-rule", "--", "echo", "inner-ran"))
    proc = hostrun.run("-m", "128M", "--label", "outer", "--", "sh", "-c", inner)
    assert proc.returncode == 0, proc.stderr
    assert "inner-ran" in proc.stdout


# -------------------------------------------------------------------- through the hooks and shims
def test_the_wrapped_command_gets_the_long_job_rule_and_exits_244(hostrun: Hostrun,
                                                                  tmp_path: Path) -> None:
    hostrun.configure(slice="1G", top='long_job_threshold = "2h"\n[agents]\nmode = "wrap"')
    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    record(hostrun, "proj:make", 3 * 3600.0)  # this project's `make` took 3 h last time
    data = event("pre_tool_use_bash", command="make -j8 > made.txt", cwd=str(project),
                 permission_mode="bypassPermissions")
    answer = real_hook(hostrun, data, "pre-tool-use")
    assert answer is not None
    rewritten = answer["hookSpecificOutput"]["updatedInput"]["command"]
    assert "--long-job-rule" in rewritten and "--gpu-memory" not in rewritten  # make is not GPU work
    proc = subprocess.run(["bash", "-c", rewritten], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 244, proc.stderr
    assert "expected duration 3.0 h (recorded on local)" in proc.stderr
    assert not (project / "made.txt").exists()  # nothing ran
    assert hostrun.bookings() == []


def test_a_gpu_command_is_rewritten_to_book_vram_only_where_there_are_gpus(
        hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(slice="1G", top='[agents]\nmode = "wrap"')
    fake = FakeGpus(tmp_path)
    data = event("pre_tool_use_bash", command="python3 train.py --epochs 3", cwd=str(tmp_path),
                 permission_mode="bypassPermissions")
    with_gpu = real_hook(hostrun, data, "pre-tool-use", env=fake.env())
    assert with_gpu is not None
    assert "--gpu-memory auto" in with_gpu["hookSpecificOutput"]["updatedInput"]["command"]
    none = real_hook(hostrun, data, "pre-tool-use", env=fake.env(HOSTRUN_NVIDIA_PROC=str(fake.no_gpus)))
    assert none is not None
    assert "--gpu-memory" not in none["hookSpecificOutput"]["updatedInput"]["command"]


def test_a_shimmed_tool_gets_the_long_job_rule(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(top='long_job_threshold = "2h"')
    bin_dir, shims = fake_tools(tmp_path), tmp_path / "shims"
    assert install(hostrun, shims, "cargo").returncode == 0
    env = env_with(hostrun, shims, bin_dir)
    first = sh("cargo build --release", env, tmp_path)
    assert first.returncode == 0 and "fake cargo build" in first.stdout, first.stderr
    (label,) = {r["label"] for r in json.loads(hostrun.run("history", "--json").stdout)}
    record(hostrun, label, 5 * 3600.0)  # the same invocation once took 5 h
    second = sh("cargo build --release", env, tmp_path)
    assert second.returncode == 244, second.stderr
    assert "fake cargo" not in second.stdout and "expected duration 5.0 h" in second.stderr


# -------------------------------------------------------------------- VRAM: measured, recorded, booked
def test_vram_booking_is_a_quarter_over_the_worst_rounded_to_256_mib() -> None:
    assert vram_booking(3000 * MiB) == 3840 * MiB  # 3750 MiB, up to the next 256 MiB
    assert vram_booking(1 * MiB) == 256 * MiB
    assert vram_booking(64 * GiB) == 80 * GiB


def test_a_gpu_runs_vram_peak_is_recorded_and_auto_books_from_it(hostrun: Hostrun,
                                                                 tmp_path: Path) -> None:
    fake = FakeGpus(tmp_path)
    fake.set((81920, 0, 81920))
    env = fake.env()
    auto = hostrun.run("-m", "64M", "--label", "train", "--gpu-memory", "auto", "--", "true", env=env)
    assert auto.returncode == 0, auto.stderr
    assert "--gpu-memory auto: 2.0 GiB (default_gpu_memory: no VRAM recorded" in auto.stderr
    assert peak_row(hostrun, "train")[0] == 0  # type: ignore[index]  # measured: it used none
    # The job shows on the GPU with 3000 MiB under its own pid; another process's 9000 MiB is not its.
    out = tmp_path / "r.json"
    script = (f"printf '{fake.uuid(0)}, %s, 3000\\n{fake.uuid(0)}, 1, 9000\\n' $$ > {fake.apps_file}; "
              f"sleep 2.5; : > {fake.apps_file}")
    run = hostrun.run("-m", "64M", "--label", "train", "--gpu-memory", "1G", "--result-file", str(out),
                      "--", "sh", "-c", script, env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["vram_peak_bytes"] == 3000 * MiB
    assert peak_row(hostrun, "train")[0] == 3000 * MiB  # type: ignore[index]
    again = hostrun.run("-m", "64M", "--label", "train", "--gpu-memory", "auto", "--result-file",
                        str(out), "--", "true", env=env)
    assert again.returncode == 0, again.stderr
    assert "--gpu-memory auto: 3.8 GiB (its worst recorded VRAM 2.9 GiB and a quarter)" in again.stderr
    assert json.loads(out.read_text())["gpu_bytes"] == 3840 * MiB
    assert hostrun.bookings() == []


def test_the_vram_peak_survives_a_rebuild_from_the_journal(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ledger = Ledger(str(state))
    ledger.record_peak("gpu-job", "local", 64 * MiB, False, 1.0, cap=None, vram=5000 * MiB)
    ledger.record_peak("gpu-job", "local", 64 * MiB, False, 1.0, cap=None, vram=4000 * MiB)
    ledger.record_peak("cpu-job", "local", 64 * MiB, False, 1.0, cap=None)
    before = ledger.peaks()
    ledger.close()
    assert {p.label: p.max_vram for p in before} == {"gpu-job": 5000 * MiB, "cpu-job": None}
    (state / "ledger.sqlite3").write_bytes(b"garbage" * 100)
    for side in ("-wal", "-shm"):
        (state / f"ledger.sqlite3{side}").unlink(missing_ok=True)
    said: list[str] = []
    ledger = Ledger(str(state), said.append, lambda: [])
    assert ledger.peaks() == before and "was damaged" in said[0]
    ledger.close()
    # a compacted journal (P lines) keeps it too, and a P line from before VRAM reads as None
    lines = [peakjournal.peak_line(p) for p in before]
    assert lines[1].rstrip("\n").split("\t")[-1] == str(5000 * MiB)
    used: list[tuple[object, ...]] = []
    journal = tmp_path / "old.journal"
    journal.write_text(peakjournal.HEADER + "".join(lines) +
                       "P\told\tlocal\t1\t1\t1\t0\t-\t-\t1.0\t-\t-\t0\n")
    peakjournal.replay(str(journal), lambda *a: None, used.append, lambda *a: None)
    assert [row[12] for row in used] == [None, 5000 * MiB, None]  # max_vram


def test_a_ledger_from_before_vram_gains_the_column(tmp_path: Path) -> None:
    state = tmp_path / "state"
    Ledger(str(state)).close()
    con = sqlite3.connect(state / "ledger.sqlite3")
    con.execute("ALTER TABLE peaks DROP COLUMN max_vram")
    con.execute("PRAGMA user_version=6")
    con.commit()
    con.close()
    ledger = Ledger(str(state))
    ledger.record_peak("g", "local", MiB, False, 1.0, cap=None, vram=7 * MiB)
    assert ledger.peak("g", "local").max_vram == 7 * MiB  # type: ignore[union-attr]
    ledger.close()
