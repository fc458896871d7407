"""Configuration loading, CLI usage errors and the inspection commands, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.config import load_settings
from dispatch.core.errors import ConfigError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import GiB
from tests.conftest import Hostrun


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dispatch", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60, check=False)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hostrun: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[hosts.local]\nslise = '8G'\n", "hosts.local.slise: unknown key"),
        ("statedir = '/tmp/x'\n", "statedir: unknown key"),
        ("[hosts.local]\nslice = '8X'\n", "hosts.local.slice: not a size: '8X'"),
        ("pending_window = 'soon'\n", "pending_window: not a duration"),
        ("[hosts.local]\nslice = '8G'\nreserve = '2G'\n", "hosts.local: set either slice or reserve"),
        ("[hosts.local]\nbackend = 'magic'\n", "hosts.local: backend must be one of"),
        ("[hosts.peer]\npeer_memory_cap = '4G'\n", "hosts.peer: a peer needs ssh"),
        ("[hosts.local]\nheavy_threads = 0\n", "hosts.local.heavy_threads"),
        ("enable_across_machines = 'perhaps'\n", "enable_across_machines"),
        ("this is not toml\n", "not valid TOML"),
        ("[hosts.local]\nmax_runtime = '0s'\n", "hosts.local.max_runtime: '0s': must be longer than 0"),
        ("[hosts.peer]\nssh = 'p'\nmax_runtime = '90m'\n",
         "hosts.peer: max_runtime of a peer is set in the peer's own config"),
        ("[hosts.local]\nssh = 'p'\n", "hosts.local: ssh is for peers; local is this machine"),
        ("[hosts.box]\nkind = 'pbs'\nssh = 'p'\n",
         "hosts.box.kind: unknown kind 'pbs' (known: local, slurm, ssh)"),
        ("[hosts.local]\nkind = 'ssh'\n",
         "hosts.local.kind: local is this machine, so its kind is local, not 'ssh'"),
        ("[hosts.box]\nkind = 'local'\n",
         "hosts.box.kind: kind 'local' is this machine, which is [hosts.local]"),
        ("[hosts.box]\nkind = 'ssh'\n", "hosts.box: a peer needs ssh"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, body: str, needle: str) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(body)
    proc = cli("--config", str(cfg), "--", "true")
    assert proc.returncode == ExitCode.USAGE
    line = one_error_line(proc)
    assert needle in line and str(cfg) in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--frobnicate", "--", "true"], "unrecognized arguments: --frobnicate"),
        (["-m", "12X", "--", "true"], "not a size"),
        (["--max-runtime", "later", "--", "true"], "not a duration"),
        (["--threads", "0", "--", "true"], "must be from 1 to 4096"),
        (["--"], "no command given"),
        ([], "no command given"),
        (["--config", "/nonexistent/hosts.toml", "--", "true"], "config file not found"),
        (["ledger", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    proc = cli(*args)
    assert proc.returncode == ExitCode.USAGE
    assert needle in one_error_line(proc)


def test_search_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config" / "hostrun").mkdir(parents=True)
    (home / ".config" / "hostrun" / "hosts.toml").write_text("[hosts.local]\nslice = '1G'\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    old = os.getcwd()
    os.chdir(cwd)
    try:
        assert load_settings(None, env).local.slice_bytes == 1 * GiB
        (cwd / "hosts.toml").write_text("[hosts.local]\nslice = '2G'\n")
        assert load_settings(None, env).local.slice_bytes == 2 * GiB
        env_cfg = tmp_path / "env.toml"
        env_cfg.write_text("[hosts.local]\nslice = '3G'\n")
        assert load_settings(None, {**env, "HOSTRUN_CONFIG": str(env_cfg)}).local.slice_bytes == 3 * GiB
        explicit = tmp_path / "explicit.toml"
        explicit.write_text("[hosts.local]\nslice = '4G'\n")
        settings = load_settings(str(explicit), {**env, "HOSTRUN_CONFIG": str(env_cfg)})
        assert settings.local.slice_bytes == 4 * GiB
        with pytest.raises(ConfigError, match="HOSTRUN_CONFIG names a missing file"):
            load_settings(None, {**env, "HOSTRUN_CONFIG": str(tmp_path / "gone.toml")})
    finally:
        os.chdir(old)


def test_no_file_means_builtin_default(tmp_path: Path) -> None:
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        settings = load_settings(None, {"HOME": str(tmp_path)})
    finally:
        os.chdir(old)
    assert settings.source == "<built-in default>"
    assert list(settings.hosts) == ["local"]
    assert settings.enable_across_machines is False
    assert settings.long_job_threshold == 7200 and settings.pending_window == 30
    assert settings.report_timeout == 12 and settings.report_deadline == 25


def test_validated_config_is_cached_and_pydantic_stays_off_the_hot_path(tmp_path: Path) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text("[hosts.local]\nslice = '1G'\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    probe = ("import sys; from dispatch.config import load_settings; "
             f"s = load_settings({str(cfg)!r}); print(s.local.slice_bytes, 'pydantic' in sys.modules)")
    run = lambda: subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,  # noqa: E731
                                 text=True, check=True).stdout.split()
    assert run() == [str(GiB), "True"]  # first load validates
    assert run() == [str(GiB), "False"]  # then the cached, normalized form serves
    cfg.write_text("[hosts.local]\nslice = '2G'\n")
    assert run() == [str(2 * GiB), "True"]  # a changed file is validated again
    cache_files = list((tmp_path / "cache" / "hostrun" / "config").iterdir())
    assert cache_files and all((f.stat().st_mode & 0o077) == 0 for f in cache_files)


def test_environment_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text("enable_across_machines = false\n[hosts.peer]\nssh = 'me@peer'\npeer_memory_cap = '4G'\n")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    base = load_settings(str(cfg), env)
    assert base.enable_across_machines is False and base.hosts["peer"].options["peer_memory_cap"] == 4 * GiB
    over = load_settings(str(cfg), {**env, "ENABLE_ACROSS_MACHINES": "1", "PEER_MEMORY_CAP": "6G"})
    assert over.enable_across_machines is True and over.hosts["peer"].options["peer_memory_cap"] == 6 * GiB
    with pytest.raises(ConfigError, match="PEER_MEMORY_CAP"):
        load_settings(str(cfg), {**env, "PEER_MEMORY_CAP": "lots"})
    with pytest.raises(ConfigError, match="ENABLE_ACROSS_MACHINES"):
        load_settings(str(cfg), {**env, "ENABLE_ACROSS_MACHINES": "maybe"})


def test_codes_lists_every_exit_code() -> None:
    proc = cli("codes", "--json")
    assert proc.returncode == 0
    table = {row["code"]: row["name"] for row in json.loads(proc.stdout)}
    assert table == {c.value: c.outcome for c in ExitCode}
    assert table[250] == "own-cap" and table[254] == "slice-full" and table[243] == "never-fits"
    human = cli("codes")
    assert human.returncode == 0 and "slice-full" in human.stdout


def test_version_and_module_entry_point() -> None:
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("hostrun ")


def test_no_cap_backend_refuses_unless_asked(hostrun: Hostrun) -> None:
    hostrun.configure(slice="300M", host='backend = "none"')
    refused = hostrun.run("--", "true")
    assert refused.returncode == ExitCode.NOT_RUN
    assert "--no-cap" in one_error_line(refused)
    ran = hostrun.run("--no-cap", "--", "sh", "-c", "echo ran")
    assert ran.returncode == 0 and ran.stdout.strip() == "ran"


def test_forcing_an_unusable_backend_is_a_clear_error(hostrun: Hostrun) -> None:
    hostrun.configure(slice="300M", host='backend = "systemd"')
    proc = hostrun.run("--", "true")
    assert proc.returncode == ExitCode.NOT_RUN
    assert "hosts.local.backend = 'systemd' is not usable here" in one_error_line(proc)


def test_doctor_report_and_ledger(hostrun: Hostrun) -> None:
    doctor = json.loads(hostrun.run("doctor", "--json").stdout)
    assert doctor["backend"] == "cgroup1"
    assert doctor["slice"] == str(hostrun.slice_dir)
    assert {p["backend"]: p["ok"] for p in doctor["probes"]}["cgroup1"] is True
    assert hostrun.run("-m", "64M", "--label", "seen", "--", "true").returncode == 0
    (reading,) = json.loads(hostrun.run("report", "--json").stdout)["hosts"]
    assert reading["host"] == "local" and reading["ok"] and reading["error"] is None
    report = reading["report"]
    assert report["slice"]["limit"] == 300 << 20
    assert report["backend"] == "cgroup1" and report["queue_length"] == 0 and report["running"] == []
    for key in ("total", "available"):
        assert report["memory"][key] > 0
    assert report["cores"] >= 1 and report["heavy_threads"] >= 1 and len(report["load"]) == 3
    ledger = json.loads(hostrun.run("ledger", "--json").stdout)
    assert [p["label"] for p in ledger["peaks"]] == ["seen"]
    assert ledger["running"] == [] and ledger["queue"] == []
    for human in (hostrun.run("doctor"), hostrun.run("report"), hostrun.run("ledger")):
        assert human.returncode == 0 and human.stdout.strip()


def test_report_shows_a_running_job(hostrun: Hostrun, tmp_path: Path) -> None:
    started = tmp_path / "started"
    job = hostrun.popen("-m", "64M", "--label", "busy", "--", "sh", "-c", f"touch {started}; sleep 2")
    from tests.conftest import wait_for

    wait_for(started.exists)
    report = json.loads(hostrun.run("report", "--json").stdout)["hosts"][0]["report"]
    (running,) = report["running"]
    assert running["label"] == "busy" and running["booked"] == 64 << 20 and running["kind"] == "cap"
    assert report["slice"]["booked"] == 64 << 20
    job.wait(timeout=20)
    assert job.returncode == 0


def test_unset_state_dir_follows_the_environment_despite_the_cache(tmp_path: Path) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text("[hosts.local]\nslice = '1G'\n")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    first = load_settings(str(cfg), {**env, "XDG_STATE_HOME": str(tmp_path / "a")})
    second = load_settings(str(cfg), {**env, "XDG_STATE_HOME": str(tmp_path / "b")})
    assert first.state_dir == str(tmp_path / "a" / "hostrun")
    assert second.state_dir == str(tmp_path / "b" / "hostrun")


def test_memory_cap_below_one_mib_is_refused() -> None:
    proc = cli("-m", "0", "--", "true")
    assert proc.returncode == ExitCode.USAGE and "too small" in one_error_line(proc)


def test_each_top_level_key_is_declared_once_and_defaults_to_settings() -> None:
    """A top-level key is one ``hostkeys.TOP`` entry naming a ``Settings`` field: the model accepts
    exactly those (and the tables), both parsers read them from it, and an absent key leaves the
    field at ``Settings``' own default (written nowhere else)."""
    from dispatch.config.model import config_model
    from dispatch.core.configfile import settings_from_dict
    from dispatch.core.hostkeys import TOP
    from dispatch.core.settings import Settings
    from dispatch.hosts.kinds import specs

    tables = {"hosts", "groups", "toolchain_programs", "agents", "sessions"}
    scalar = set(Settings._fields) - tables - {"source", "overrides", "requeue_groups"}  # [groups.*]
    assert [k.key for k in TOP] == [k.field for k in TOP] and {k.field for k in TOP} == scalar
    model = config_model(tuple(specs().values()))
    assert set(model.model_fields) == scalar | tables
    built = settings_from_dict({}, "hosts.toml")
    for field in scalar - {"state_dir"}:  # state_dir: "" until resolved from the environment
        assert getattr(built, field) == Settings._field_defaults[field], field
    assert built.state_dir == ""
