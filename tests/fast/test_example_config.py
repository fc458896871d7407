"""``hosts.example.toml`` says it holds every key with its default: it must validate, change nothing,
and name every key the configuration knows (top level, ``[agents]``, every host kind's). Pure: the
model and the key tables are read, no root or host needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dispatch.config.model import AgentsModel, SessionsModel, _ConfigBase, validate_file
from dispatch.core.hostkeys import COMMON
from dispatch.core.settings import Settings
from dispatch.hosts.kinds import specs

EXAMPLE = Path(__file__).resolve().parents[2] / "hosts.example.toml"


def _named_keys() -> set[str]:
    """Every ``key =`` in the file, set or commented out (``#key = ...``)."""
    return set(re.findall(r"^#?([a-z_]+) = ", EXAMPLE.read_text(), re.M))


def test_the_example_validates_and_changes_no_default(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = validate_file(str(EXAMPLE))
    default = Settings.default()
    for field in ("long_job_threshold", "pending_window", "report_timeout", "report_deadline",
                  "gamble_size", "status_interval", "kill_grace", "control_persist", "agent_idle",
                  "alert_wait_after", "clear_mark_after", "history_days", "history_rows", "agents",
                  "sessions"):
        assert getattr(settings, field) == getattr(default, field), field


def test_the_example_names_every_key() -> None:
    named = _named_keys()
    top = set(_ConfigBase.model_fields) - {"agents", "groups", "toolchain_programs", "sessions"}
    agents = set(AgentsModel.model_fields) | set(SessionsModel.model_fields)
    kinds = specs().values()
    hosts = {key.key for key in COMMON} | {key.key for spec in kinds for key in spec.keys} | {"kind"}
    missing = sorted((top | agents | hosts | {"max_running"}) - named)
    assert missing == [], f"hosts.example.toml does not mention: {missing}"
    tables = set(re.findall(r"^#?\[([a-z_]+)[.\]]", EXAMPLE.read_text(), re.M))
    assert {"agents", "groups", "toolchain_programs", "hosts", "sessions"} <= tables
