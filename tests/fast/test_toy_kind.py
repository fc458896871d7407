"""A fourth host kind, added as docs/design.md says, registered by these tests only and run through
the real command line (in this process, so the registration holds): ``hostrun report`` shows what
it says of itself, ``--host`` runs a job there with the job's own exit code, the dispatcher sends
it a job that this machine's slice cannot hold, and the agent hooks' table asks it for its line.
Nothing in ``dispatch/`` names it (checked below): the kind is ``tests/support/toykind.py`` alone."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.cli.main import main
from dispatch.core.units import GiB
from dispatch.hosts.kinds import KINDS
from tests.support.toykind import ToyHost

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setitem(KINDS, "toy", ToyHost)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HOSTRUN_CONFIG", raising=False)
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\nenable_across_machines = true\n"
                   "[hosts.local]\nslice = '1G'\n"
                   "[hosts.farm]\nkind = 'toy'\nqueue = 'q1'\nlimit = '2G'\n")
    yield cfg


def hostrun(cfg: Path, *args: str) -> int:
    return main(["--config", str(cfg), *args])


def test_report_shows_what_the_toy_says_of_itself(config: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "toy-farm.json").write_text(json.dumps(
        [{"id": 1, "pid": os.getpid(), "label": "build", "booked": GiB, "age_s": 0.0}]))
    assert hostrun(config, "report", "--host", "farm") == 0
    out = capsys.readouterr().out
    assert "farm: a toy with 1.0 GiB free of 2.0 GiB" in out
    assert "jobs on farm" in out and re.search(r"build\s*│\s*1073741824", out)
    assert hostrun(config, "report", "--host", "farm", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    report = data["hosts"][0]["report"]
    assert (report["kind"], report["queue_name"], report["slice"]) == (
        "toy", "q1", {"limit": 2 * GiB, "free": GiB})
    assert [j["label"] for j in report["running"]] == ["build"]


def test_host_runs_a_job_there_and_passes_its_exit_code_through(config: Path, tmp_path: Path) -> None:
    out, result = tmp_path / "ran", tmp_path / "result.json"
    code = hostrun(config, "--host", "farm", "--result-file", str(result), "--",
                   "sh", "-c", f"echo here > {out}; exit 3")
    assert code == 3 and out.read_text() == "here\n"
    outcome = json.loads(result.read_text())
    assert (outcome["host"], outcome["exit_code"], outcome["outcome"]) == ("farm", 3, "exit")
    assert json.loads((tmp_path / "state" / "toy-farm.json").read_text()) == []  # its job list emptied


def test_the_dispatcher_asks_the_toy_and_sends_it_what_fits_only_there(
        config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hostrun(config, "dispatch", "--json", "-m", "1536M", "--", "true") == 0
    decision = json.loads(capsys.readouterr().out)
    assert (decision["action"], decision["host"]) == ("peer", "farm")
    farm = next(j for j in decision["judgements"] if j["host"] == "farm")
    assert farm["fits"] and farm["reason"] == "toy fits: 2.0 GiB free"
    out = tmp_path / "ran"
    assert hostrun(config, "--auto", "-m", "1536M", "--", "sh", "-c", f"touch {out}") == 0
    assert out.exists()
    assert "farm toy fits: 2.0 GiB free" in capsys.readouterr().err
    # larger than every host, the toy's own rule among them: refused (243)
    assert hostrun(config, "dispatch", "--json", "-m", "3G", "--", "true") == 243  # what --auto would exit
    farm = next(j for j in json.loads(capsys.readouterr().out)["judgements"] if j["host"] == "farm")
    assert farm["reason"] == "3.0 GiB is more than the toy's 2.0 GiB" and not farm["could_ever_fit"]
    assert hostrun(config, "--auto", "-m", "3G", "--", "true") == 243
    assert "no host could ever run it" in capsys.readouterr().err


def test_the_hooks_table_line_is_the_toys_own(config: Path) -> None:
    from dispatch.config import load_settings
    from dispatch.hooks import table
    from dispatch.placement.reports import read_reports

    settings = load_settings(str(config))
    text = table.text(settings, read_reports(settings), peers=True)
    assert "- farm: toy queue q1, 2.0 GiB free of 2.0 GiB, 0 running" in text.splitlines()


def test_nothing_in_the_package_names_the_toy() -> None:
    """The kind is added without touching ``dispatch/``: no module mentions it."""
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "dispatch").rglob("*.py")
             if re.search(r"\btoy\b", p.read_text(), re.IGNORECASE)]
    assert named == []
