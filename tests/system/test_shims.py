"""PATH shims (issue 11): ``hostrun shims install DIR`` wrappers route a heavy ``cargo test`` through
hostrun (capped, booked, in the history) and run a light ``cargo --version`` directly.

The real tool is a fake ``cargo`` shell script later on PATH that prints its arguments and whether
it runs inside a hostrun job (``$HOSTRUN_JOB``), and exits with ``$FAKE_EXIT``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Hostrun
from tests.support.shimtools import env_with, fake_tools, install, sh


def runs(hostrun: Hostrun) -> list[dict[str, Any]]:
    proc = hostrun.run("history", "--json", "--limit", "0")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_heavy_runs_capped_and_booked_light_runs_directly(hostrun: Hostrun, tmp_path: Path) -> None:
    bin_dir, shims = fake_tools(tmp_path), tmp_path / "shims"
    proc = install(hostrun, shims, "cargo", "make")
    assert proc.returncode == 0, proc.stderr
    shim = shims / "cargo"
    assert shim.stat().st_mode & 0o7777 == 0o755 and shims.stat().st_mode & 0o777 == 0o755
    env = env_with(hostrun, shims, bin_dir, HOSTRUN_SESSION="shimmed")
    heavy = sh("cargo test --workspace", env, tmp_path)
    assert heavy.returncode == 0, heavy.stderr
    assert "fake cargo test --workspace" in heavy.stdout and "in-job " in heavy.stdout
    (run,) = runs(hostrun)
    assert run["session"] == "shimmed" and run["label"].startswith("cargo-")
    assert run["command"].endswith("/bin/cargo test --workspace") and run["exit_code"] == 0
    assert run["cap_bytes"] == 300 << 20 and run["booking_kind"] == "gamble"  # capped at the slice
    light = sh("cargo --version", env, tmp_path)
    assert light.returncode == 0 and light.stdout == "fake cargo --version\n", light.stderr
    assert len(runs(hostrun)) == 1  # not booked
    # exit codes pass through both ways
    assert sh("cargo --version", {**env, "FAKE_EXIT": "3"}, tmp_path).returncode == 3
    assert sh("cargo test", {**env, "FAKE_EXIT": "4"}, tmp_path).returncode == 4
    assert [r["exit_code"] for r in runs(hostrun)] == [0, 4]
    assert hostrun.bookings() == []


def test_nested_in_a_hostrun_job_books_once(hostrun: Hostrun, tmp_path: Path) -> None:
    bin_dir, shims = fake_tools(tmp_path), tmp_path / "shims"
    assert install(hostrun, shims, "cargo").returncode == 0
    env = env_with(hostrun, shims, bin_dir)
    proc = subprocess.run(hostrun.argv("-m", "200M", "--label", "outer", "--", "sh", "-c", "cargo test"),
                          env=env, cwd=tmp_path, text=True, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "fake cargo test" in proc.stdout and "in-job" in proc.stdout
    assert [r["label"] for r in runs(hostrun)] == ["outer"]


def test_two_shim_directories_never_loop(hostrun: Hostrun, tmp_path: Path) -> None:
    bin_dir, first, second = fake_tools(tmp_path), tmp_path / "shims1", tmp_path / "shims2"
    assert install(hostrun, first, "cargo", "no-such-tool").returncode == 0
    assert install(hostrun, second, "cargo", "no-such-tool").returncode == 0
    env = env_with(hostrun, first, second, bin_dir)
    light = sh("cargo --version", env, tmp_path)
    assert light.returncode == 0 and light.stdout == "fake cargo --version\n", light.stderr
    heavy = sh("cargo build", env, tmp_path)
    assert heavy.returncode == 0 and "fake cargo build" in heavy.stdout, heavy.stderr
    assert len(runs(hostrun)) == 1
    # no real tool after the shims: 127, one line, no loop
    alone = sh("no-such-tool --version", env, tmp_path)
    assert alone.returncode == 127 and "no no-such-tool on PATH" in alone.stderr


def test_list_and_uninstall_touch_only_ours(hostrun: Hostrun, tmp_path: Path) -> None:
    bin_dir, shims = fake_tools(tmp_path), tmp_path / "shims"
    shims.mkdir(mode=0o755)
    mine = shims / "make"
    mine.write_text("#!/bin/sh\necho my own make\n")
    refused = install(hostrun, shims, "cargo", "make")
    assert refused.returncode == 2 and "is not a hostrun shim" in refused.stderr
    assert not (shims / "cargo").exists()  # refused before anything was written
    assert install(hostrun, shims, "cargo").returncode == 0
    listed = subprocess.run(hostrun.argv("shims", "list", str(shims), "--json"), env=env_with(
        hostrun, shims, bin_dir), text=True, capture_output=True, check=False)
    assert json.loads(listed.stdout) == [{"tool": "cargo", "path": str(shims / "cargo"),
                                          "real": str(bin_dir / "cargo")}]
    proc = hostrun.run("shims", "uninstall", str(shims))
    assert proc.returncode == 0 and proc.stdout.strip() == f"removed {shims / 'cargo'}"
    assert sorted(p.name for p in shims.iterdir()) == ["make"]


def test_foreign_or_others_writable_dir_is_refused(hostrun: Hostrun, other_user: Any,
                                                   tmp_path: Path) -> None:
    proc = install(hostrun, other_user.home, "cargo")
    assert proc.returncode == 2 and "owned by hostrun-other" in proc.stderr, proc.stderr
    assert not (other_user.home / "cargo").exists()
    proc = install(hostrun, other_user.home / "sub", "cargo")  # not even created in there
    assert proc.returncode == 2 and not (other_user.home / "sub").exists()
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    proc = install(hostrun, loose, "cargo")
    assert proc.returncode == 2 and "writable by group and others" in proc.stderr
    assert "Traceback" not in proc.stderr and not (loose / "cargo").exists()
    bad = install(hostrun, tmp_path / "x", "../cargo")
    assert bad.returncode == 2 and "not a program name" in bad.stderr


def test_project_patterns_decide_light_and_heavy(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(top='[agents]\nlight = ["cargo check"]\nheavy = ["cargo sweep"]')
    bin_dir, shims = fake_tools(tmp_path), tmp_path / "shims"
    assert install(hostrun, shims, "cargo").returncode == 0
    env = env_with(hostrun, shims, bin_dir)
    # cargo check is heavy by default: the project's light pattern runs it directly
    light = sh("cargo check --workspace", env, tmp_path)
    assert light.returncode == 0 and light.stdout == "fake cargo check --workspace\n", light.stderr
    assert light.stderr == "" and runs(hostrun) == []
    # cargo sweep matches no default: the project's heavy pattern books it
    heavy = sh("cargo sweep --time 30", env, tmp_path)
    assert heavy.returncode == 0 and "in-job " in heavy.stdout, heavy.stderr
    assert [r["command"].split("/")[-1] for r in runs(hostrun)] == ["cargo sweep --time 30"]
    # the config's cache is warm now: a light invocation loads no pydantic
    timed = subprocess.run([sys.executable, "-X", "importtime", "-I", str(shims / "cargo"), "check"],
                           env=env, cwd=tmp_path, text=True, capture_output=True, timeout=60, check=False)
    assert timed.returncode == 0 and timed.stdout == "fake cargo check\n"
    modules = {line.split("|")[-1].strip() for line in timed.stderr.splitlines()}
    assert "dispatch.config" in modules and "pydantic" not in modules


def test_a_broken_config_still_lets_a_light_tool_through(hostrun: Hostrun, tmp_path: Path) -> None:
    bin_dir, shims = fake_tools(tmp_path), tmp_path / "shims"
    assert install(hostrun, shims, "cargo").returncode == 0
    hostrun.config_path.write_text('state_dir = "/tmp"\n[agents]\nmode = "block"\n')
    env = env_with(hostrun, shims, bin_dir)
    light = sh("cargo --version", env, tmp_path)
    assert light.returncode == 0 and light.stdout == "fake cargo --version\n"
    assert light.stderr.count("\n") == 1, light.stderr
    assert light.stderr.startswith("hostrun shim: cargo: warning: configuration not usable (")
    assert "agents.mode" in light.stderr and "[agents] patterns are not applied" in light.stderr
    # a heavy one goes to hostrun, which refuses the broken config: exit 2, nothing ran or booked
    heavy = sh("cargo test", env, tmp_path)
    assert heavy.returncode == 2 and "fake cargo" not in heavy.stdout
    assert heavy.stderr.startswith("hostrun: error: ") and heavy.stderr.count("\n") == 1, heavy.stderr
    assert "Traceback" not in light.stderr + heavy.stderr
