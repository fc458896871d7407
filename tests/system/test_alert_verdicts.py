"""Alerts and marks come from what happened, never from the exit number alone (issue 27, item 1).

A job may exit 250 or 254 by itself: nothing was killed, so no ``own-cap``/``slice-full`` alert (the
agents' Stop hook blocks on alerts), no mark on its label, no ceiling in its peak record. Run for
real: on this host (cgroups, the ledger), on an sshd peer (the controller alerts for its peer) and
on the private Slurm cluster (srun's status 250 is the job's, not Slurm's OUT_OF_MEMORY).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.core.outcome import Outcome
from dispatch.local.alertlog import for_outcome
from tests.conftest import Hostrun
from tests.support.peers import setup

PY = sys.executable


def alerts_in(state_dir: Path) -> list[dict[str, Any]]:
    path = state_dir / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def peak_record(hostrun: Hostrun, label: str) -> dict[str, Any]:
    done = hostrun.run("ledger", "--json")
    assert done.returncode == 0, done.stderr
    (peak,) = [p for p in json.loads(done.stdout)["peaks"] if p["label"] == label]
    return peak  # type: ignore[no-any-return]


@pytest.mark.parametrize("code", [250, 254])
def test_a_job_exiting_250_or_254_by_itself_raises_no_alert_and_no_mark(hostrun: Hostrun,
                                                                        tmp_path: Path,
                                                                        code: int) -> None:
    out = tmp_path / "result.json"
    done = hostrun.run("--label", "own-exit", "--session", "s1", "--result-file", str(out), "--",
                       "sh", "-c", f"exit {code}")
    assert done.returncode == code, done.stderr
    assert json.loads(out.read_text())["outcome"] == "exit"
    assert "alert:" not in done.stderr and "killed" not in done.stderr
    assert alerts_in(hostrun.state_dir) == []
    unread = hostrun.run("alerts", "--session", "s1", "--unread", "--json")
    assert json.loads(unread.stdout) == [], unread.stderr
    peak = peak_record(hostrun, "own-exit")
    assert peak["hit_ceiling"] is False and peak["slice_full_at"] is None
    assert peak["marked_because"] == []


def test_an_outcome_alerts_only_as_hostrun_s_own_verdict() -> None:
    """The rule itself, for every caller (runner, peer run, Slurm run): the outcome name decides."""
    def outcome(code: int, name: str) -> Outcome:
        return Outcome(exit_code=code, outcome=name, host="local", label="x", argv=["true"],
                       cap_bytes=64 << 20, peak_bytes=10 << 20)

    assert for_outcome(outcome(250, "exit"), "s") is None
    assert for_outcome(outcome(254, "exit"), "s") is None
    own = for_outcome(outcome(250, ExitCode.OWN_CAP.outcome), "s")
    full = for_outcome(outcome(254, ExitCode.SLICE_FULL.outcome), "s")
    assert own is not None and own["kind"] == "own-cap"
    assert full is not None and full["kind"] == "slice-full"


def test_a_peer_job_exiting_250_by_itself_raises_no_alert(hostrun: Hostrun, peers: Any,
                                                          tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path)
    done = hostrun.run("--peer", "--label", "own-exit", "-m", "64M", "--", "sh", "-c", "exit 250",
                       cwd=tree)
    assert done.returncode == 250, done.stderr
    assert "alert:" not in done.stderr
    assert alerts_in(hostrun.state_dir) == []


def test_a_slurm_job_exiting_250_by_itself_is_no_kill(slurm: Any, tmp_path: Path) -> None:
    import subprocess

    state = tmp_path / "state"
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"enable_across_machines = true\nstate_dir = '{state}'\nkill_grace = '2s'\n"
                   f"[hosts.farm]\nkind = 'slurm'\nslurm_conf = '{slurm.conf}'\n")
    out = tmp_path / "result.json"
    done = subprocess.run([PY, "-m", "dispatch", "--config", str(cfg), "--host", "farm", "-l",
                           "own-exit", "-m", "64M", "--result-file", str(out), "--", "sh", "-c",
                           "exit 250"], capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 250, done.stderr
    result = json.loads(out.read_text())
    assert (result["outcome"], result["hit_ceiling"]) == ("exit", False), result
    assert alerts_in(state) == []
