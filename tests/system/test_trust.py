"""The trust model, attacked by a real second local user (fixture ``other_user``).

hostrun runs as root next to other users. It trusts only files owned by the invoking user or root that
nobody else can write (configuration files, the ``ssh_config`` and ``identity_file`` they name, the
config cache), and only directories it owns and nobody else can write (the state directory, the
ControlMaster socket directory, the config cache directory, the agent's directory on a peer). Each
attack below worked before the trust checks existed: the marker file a foreign ``ProxyCommand`` touches
was created, root's ssh master went through another user's directory, a forged cache was read back.
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch.config import _cache_key, load_settings
from dispatch.core.errors import ConfigError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.fingerprint import short_hash
from dispatch.core.settings import Settings
from dispatch.core.units import GiB
from dispatch.hosts.ssh.transport import control_dir
from tests.conftest import Hostrun, OtherUser

TOP = 'enable_across_machines = true\ntoolchain_probes = ["rsync --version"]'


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dispatch", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=90, check=False)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Root's environment with a home of its own, so no real ~/.config or cache takes part."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTRUN_")}
    home = tmp_path / "root-home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "root-cache"),
               XDG_CONFIG_HOME=str(home / ".config"), XDG_STATE_HOME=str(home / ".state"), **extra)
    return env


def refusal(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (exit 2)."""
    assert proc.returncode == ExitCode.USAGE, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hostrun: error: "), proc.stderr
    return lines[0]


# ---------------------------------------------------------------- (b) another user's hosts.toml
def evil_project(other: OtherUser, hostrun: Hostrun, marker: Path, own_ssh_config: Path | None = None
                 ) -> Path:
    """The other user's project: a hosts.toml whose peer's ssh_config runs a command (ProxyCommand)
    and whose state_dir is theirs. Everything in it belongs to them."""
    proj = other.home / "proj"
    proj.mkdir()
    (proj / "ssh_config").write_text(f"Host *\n  ProxyCommand touch {marker}\n")
    ssh_config = own_ssh_config or proj / "ssh_config"
    (proj / "hosts.toml").write_text(
        f'state_dir = "{other.home / "state"}"\nenable_across_machines = true\nreport_timeout = "5s"\n'
        f'[hosts.local]\nslice = "300M"\ncgroup = "{hostrun.cgroup}"\n'
        f'[hosts.evil]\nssh = "evil"\nssh_config = "{ssh_config}"\n')
    other.chown(proj)
    return proj


@pytest.mark.parametrize("command", [["doctor"], ["report"], ["-m", "32M", "--", "true"]])
def test_a_foreign_hosts_toml_in_the_current_directory_is_refused(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path, command: list[str]) -> None:
    marker = tmp_path / "marker"
    proj = evil_project(other_user, hostrun, marker)
    line = refusal(cli(*command, cwd=proj, env=clean_env(tmp_path)))
    assert str(proj / "hosts.toml") in line
    assert other_user.name in line and "HOSTRUN_TRUST_CONFIG" in line and "chown" in line
    assert not marker.exists()  # the ProxyCommand never ran
    assert not (other_user.home / "state").exists()  # their state_dir was not adopted


def test_a_foreign_config_via_option_or_environment_is_refused(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    cfg = evil_project(other_user, hostrun, marker) / "hosts.toml"
    env = clean_env(tmp_path)
    assert str(cfg) in refusal(cli("--config", str(cfg), "doctor", env=env))
    assert str(cfg) in refusal(cli("report", env={**env, "HOSTRUN_CONFIG": str(cfg)}))
    assert not marker.exists() and not (other_user.home / "state").exists()


def test_the_opt_in_names_exactly_the_file_trusted(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path) -> None:
    proj = other_user.home / "proj"
    proj.mkdir()
    cfg = proj / "hosts.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                   f'[hosts.local]\nslice = "300M"\ncgroup = "{hostrun.cgroup}"\n')
    other_user.chown(proj)
    env = clean_env(tmp_path)
    refusal(cli("--config", str(cfg), "doctor", env={**env, "HOSTRUN_TRUST_CONFIG": str(proj / "x")}))
    trusted = cli("--config", str(cfg), "doctor", "--json",
                  env={**env, "HOSTRUN_TRUST_CONFIG": f"/nowhere:{cfg}"})
    assert trusted.returncode == 0, trusted.stderr
    assert json.loads(trusted.stdout)["config"] == str(cfg)


def test_the_opt_in_for_a_config_does_not_cover_the_ssh_config_it_names(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proj = evil_project(other_user, hostrun, marker)
    cfg = proj / "hosts.toml"
    line = refusal(cli("--config", str(cfg), "report", env={**clean_env(tmp_path),
                                                              "HOSTRUN_TRUST_CONFIG": str(cfg)}))
    assert str(proj / "ssh_config") in line and "hosts.evil.ssh_config" in line
    assert not marker.exists()


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_an_own_config_others_can_write_is_refused(hostrun: Hostrun, tmp_path: Path, mode: int) -> None:
    os.chmod(hostrun.config_path, mode)
    line = refusal(hostrun.run("-m", "32M", "--", "true", env=clean_env(tmp_path)))
    assert str(hostrun.config_path) in line and f"chmod go-w {hostrun.config_path}" in line
    assert not hostrun.state_dir.exists()


@pytest.mark.parametrize("key", ["ssh_config", "identity_file"])
def test_a_foreign_ssh_config_or_identity_file_named_by_a_trusted_config_is_refused(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path, key: str) -> None:
    marker = tmp_path / "marker"
    theirs = other_user.home / key
    theirs.write_text(f"Host *\n  ProxyCommand touch {marker}\n" if key == "ssh_config" else "key\n")
    os.chmod(theirs, 0o600)
    other_user.chown(theirs)
    own_ssh_config = tmp_path / "own_ssh_config"
    own_ssh_config.write_text(f"Host *\n  ProxyCommand touch {marker}\n")  # reached only if unchecked
    other = f'ssh_config = "{own_ssh_config}"' if key == "identity_file" else ""
    hostrun.configure(top="enable_across_machines = true\nreport_timeout = '5s'",
                      peers=f'[hosts.evil]\nssh = "evil"\n{key} = "{theirs}"\n{other}\n')
    for command in (["report"], ["--peer", "-m", "32M", "--", "true"]):
        line = refusal(hostrun.run(*command, env=clean_env(tmp_path), cwd=tmp_path))
        assert f"hosts.evil.{key}" in line and str(theirs) in line and other_user.name in line
    assert not marker.exists()


@pytest.mark.parametrize("owner", ["other", "root-0777"])
def test_a_state_dir_someone_else_can_write_is_refused(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path, owner: str) -> None:
    if owner == "other":
        state = other_user.home / "state"
        other_user.run(["mkdir", "-m", "700", str(state)])
    else:
        state = tmp_path / "shared-state"
        state.mkdir()
        os.chmod(state, 0o777)
    planted = state / "ledger.sqlite3"
    hostrun.state_dir = state
    hostrun.configure()
    for command in (["-m", "32M", "--", "true"], ["report"], ["doctor"]):
        line = refusal(hostrun.run(*command, env=clean_env(tmp_path)))
        assert str(state) in line
    assert not planted.exists()  # nothing of root's was written there
    hostrun.state_dir = tmp_path / "state"  # for the fixture's leak check


@pytest.mark.parametrize("where", ["their-file", "their-link", "their-dir"])
def test_an_alert_file_someone_else_controls_is_refused(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path, where: str) -> None:
    """``alert_file`` was opened by path, unchecked: root appended alerts to the other user's file
    (alerts they could forge for every session to read) or, through their symlink, to a root file
    they chose. Now it is judged as a config file is, and refused in one line before anything runs."""
    victim = tmp_path / "root-owned"
    victim.write_text("root's\n")
    os.chmod(victim, 0o600)
    theirs = other_user.home / "alerts.jsonl"
    if where == "their-file":
        other_user.run(["sh", "-c", f": > {theirs}; chmod 644 {theirs}"])
    elif where == "their-link":
        other_user.run(["ln", "-s", str(victim), str(theirs)])
    else:
        other_user.run(["mkdir", "-m", "777", str(other_user.home / "drop")])
        theirs = other_user.home / "drop" / "alerts.jsonl"
    marker = tmp_path / "ran"
    hostrun.configure(top=f'alert_file = "{theirs}"')
    for command in (["-m", "32M", "--", "touch", str(marker)], ["alerts"]):
        line = refusal(hostrun.run(*command, env=clean_env(tmp_path)))
        assert "alert_file" in line and str(theirs.parent) in line, line
    assert not marker.exists()
    assert victim.read_text() == "root's\n"
    mine = tmp_path / "mine" / "alerts.jsonl"
    mine.parent.mkdir(mode=0o700)
    hostrun.configure(top=f'alert_file = "{mine}"')
    done = hostrun.run("-m", "32M", "--", "touch", str(marker), env=clean_env(tmp_path))
    assert done.returncode == 0 and marker.exists(), done.stderr


# ---------------------------------------------------------- (a) the ControlPath fallback directory
def long_state_dir(hostrun: Hostrun, tmp_path: Path) -> str:
    hostrun.state_dir = tmp_path / ("long-" + "s" * 70) / "state"
    directory = control_dir(str(hostrun.state_dir))
    assert directory.startswith("/tmp/hostrun-ssh-")
    return directory


def make_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / "README").write_text("readme\n")
    return tree


def remove(path: str) -> None:
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("squat", ["dir-0777", "symlink-to-theirs", "theirs-0700"])
def test_a_squatted_control_dir_is_refused_before_any_ssh(
        hostrun: Hostrun, peers: Any, other_user: OtherUser, tmp_path: Path, squat: str) -> None:
    directory = long_state_dir(hostrun, tmp_path)
    peer = peers("peer1", "127.0.0.2")
    hostrun.configure(top=TOP, peers=peer.host_table())
    seen = Path(directory)
    try:
        if squat == "dir-0777":
            other_user.run(["mkdir", "-m", "777", directory])
        elif squat == "symlink-to-theirs":
            seen = other_user.home / "ctl"
            other_user.run(["mkdir", "-m", "700", str(seen)])
            other_user.run(["ln", "-s", str(seen), directory])
        else:
            other_user.run(["mkdir", "-m", "700", directory])
        for command in (["--peer", "-m", "32M", "--", "true"], ["report"]):
            line = refusal(hostrun.run(*command, cwd=make_tree(tmp_path) if "--peer" in command else None))
            assert directory in line
        assert os.listdir(seen) == []  # no master socket: no ssh went through it
        assert not (peer.home / ".cache").exists()  # nothing reached the peer
        assert not (peer.home / "hostrun-work").exists()
    finally:
        remove(directory)


def test_a_long_state_dir_gets_a_private_control_dir_and_works(
        hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    directory = long_state_dir(hostrun, tmp_path)
    peer = peers("peer1", "127.0.0.2")
    hostrun.configure(top=TOP, peers=peer.host_table())
    remove(directory)
    try:
        ran = hostrun.run("--peer", "-m", "32M", "--", "sh", "-c", "echo on-peer",
                          cwd=make_tree(tmp_path))
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "on-peer"
        st = os.lstat(directory)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
        assert stat.S_IMODE(st.st_mode) == 0o700
        # The agent's directory on the peer is private too.
        cache = peer.home / ".cache" / "hostrun"
        (agent,) = [p for p in cache.iterdir() if p.name.startswith("agent-")]
        for path in (cache, agent):
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700, path
    finally:
        remove(directory)


def test_a_foreign_agent_dir_on_the_peer_is_not_used(
        hostrun: Hostrun, peers: Any, other_user: OtherUser) -> None:
    peer = peers("peer1", "127.0.0.2")
    hostrun.configure(top=TOP, peers=peer.host_table())
    cache = peer.home / ".cache" / "hostrun"
    cache.mkdir(parents=True)
    os.chmod(cache, 0o777)
    other_user.chown(cache)
    proc = hostrun.run("report", "--json")
    assert proc.returncode == ExitCode.PEER_UNREACHABLE, proc.stderr
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert hosts["local"]["ok"] and not hosts["peer1"]["ok"]
    assert str(cache) in hosts["peer1"]["error"]
    assert os.listdir(cache) == []  # root unpacked nothing into the other user's directory


# ----------------------------------------------------------------------- (c) the config cache
def forge_cache(cache_home: Path, cfg: Path) -> Path:
    """A cache entry that passes the key check but says slice = 12345 bytes."""
    key = _cache_key(str(cfg))
    directory = cache_home / "hostrun" / "config"
    directory.mkdir(parents=True, exist_ok=True)
    forged = Settings.default(hosts={"local": Settings.default().local._replace(slice_bytes=12345)})
    path = directory / (short_hash(str(key[3]).encode(), 32) + ".marshal")
    path.write_bytes(marshal.dumps({"key": key, "settings": forged.to_normalized()}))
    return path


@pytest.mark.parametrize("how", ["foreign-cache-home", "own-file-others-can-write",
                                 "own-dir-others-can-write"])
def test_an_untrusted_config_cache_is_ignored_and_not_overwritten(
        other_user: OtherUser, tmp_path: Path, how: str) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text("[hosts.local]\nslice = '1G'\n")
    cache_home = (other_user.home if how == "foreign-cache-home" else tmp_path) / "cache"
    forged = forge_cache(cache_home, cfg)
    if how == "foreign-cache-home":
        other_user.chown(cache_home)
    elif how == "own-file-others-can-write":
        os.chmod(forged, 0o666)
    else:
        os.chmod(forged.parent, 0o777)
    before = forged.read_bytes()
    settings = load_settings(str(cfg), {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache_home)})
    assert settings.local.slice_bytes == GiB  # validated from the file, not the forged cache
    if how == "own-file-others-can-write":  # in our own private directory: replaced by a private one
        assert forged.read_bytes() != before and stat.S_IMODE(forged.stat().st_mode) == 0o600
    else:  # in a directory that is not ours alone: left alone, nothing written there
        assert forged.read_bytes() == before and os.listdir(forged.parent) == [forged.name]


def test_a_cold_cache_is_validated_once_under_a_lock(hostrun: Hostrun, tmp_path: Path) -> None:
    """Twenty concurrent runs right after a config edit: one imports pydantic, the others wait for
    its cache. Observed with ``-X importtime`` (each process lists the modules it imported)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cold-cache")}
    argv = [sys.executable, "-X", "importtime", *hostrun.argv("-m", "8M", "--", "true")[1:]]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(20)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert all(rc == 0 for rc, _, _ in results), [err[-500:] for rc, _, err in results if rc]
    importers = [err for _, _, err in results if "pydantic" in err]
    assert len(importers) == 1
    directory = tmp_path / "cold-cache" / "hostrun" / "config"
    assert len(list(directory.glob("*.marshal"))) == 1
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in directory.iterdir())


def test_load_settings_refuses_in_process_too(other_user: OtherUser, tmp_path: Path) -> None:
    cfg = other_user.home / "hosts.toml"
    cfg.write_text("[hosts.local]\nslice = '1G'\n")
    other_user.chown(cfg)
    with pytest.raises(ConfigError, match="HOSTRUN_TRUST_CONFIG"):
        load_settings(str(cfg), {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")})
    opted = load_settings(str(cfg), {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c"),
                                     "HOSTRUN_TRUST_CONFIG": str(cfg)})
    assert opted.local.slice_bytes == GiB


# ------------------------------------------- (f) a path someone else can re-point while ssh opens it
RACE_RUNS = 25


@pytest.mark.parametrize("how", ["symlink", "directory"])
def test_an_ssh_config_path_another_user_can_repoint_is_refused_every_time(
        hostrun: Hostrun, other_user: OtherUser, tmp_path: Path, how: str) -> None:
    """root's config names ``D/pub/ssh_config`` (``symlink``: ``pub`` is the other user's link in a
    sticky root directory, pointing at root's own good directory) or ``D/theirs/sub/ssh_config``
    (``directory``: ``theirs`` is their directory; ``sub`` and the file are root's). While root runs
    ``hostrun report`` again and again, the other user re-points the path at their own ssh_config
    (whose ProxyCommand would run as root) as fast as a shell loop can.

    Before, only the file and its real directory were judged, so a swap between the check and ssh's
    open won (the 4th run with a link, the 11th with a directory). Now every component of the path
    must be root's (or the caller's), so each run is refused whatever the timing: the refusal does
    not depend on which way the path points at that moment, and so {RACE_RUNS} runs with the loop
    going show that no run gets through (the old check lost within 11)."""
    import tempfile

    sticky = Path(tempfile.mkdtemp(prefix="hostrun-sticky-", dir="/tmp"))
    good = Path(tempfile.mkdtemp(prefix="hostrun-good-", dir="/tmp"))
    try:
        os.chmod(sticky, 0o1777)
        os.chmod(good, 0o755)
        (good / "ssh_config").write_text("Host *\n  ProxyCommand false\n")
        marker = tmp_path / "marker"
        evil = other_user.home / "evil"
        other_user.run(["mkdir", "-p", str(evil / "sub")])
        for d in (evil, evil / "sub"):
            (d / "ssh_config").write_text(f"Host *\n  ProxyCommand touch {marker}\n")
            os.chown(d / "ssh_config", other_user.uid, other_user.gid)
        if how == "symlink":
            named = sticky / "pub" / "ssh_config"
            other_user.run(["ln", "-s", str(good), str(sticky / "pub")])
            loop = (f"cd {sticky}; while :; do ln -sfn {good} new && mv -Tf new pub; "
                    f"ln -sfn {evil} new && mv -Tf new pub; done")
            expected = f"the symlink {sticky / 'pub'} on its path is owned by {other_user.name}"
        else:
            theirs = sticky / "theirs"
            other_user.run(["mkdir", "-m", "755", str(theirs)])
            os.mkdir(theirs / "sub", 0o755)  # root's, inside theirs
            shutil.copy(good / "ssh_config", theirs / "sub" / "ssh_config")
            named = theirs / "sub" / "ssh_config"
            loop = (f"cd {sticky}; while :; do mv -T theirs mine && mv -T {evil} theirs && "
                    f"mv -T theirs {evil} && mv -T mine theirs; done")
            expected = f"{theirs} on its path is owned by {other_user.name}"
        hostrun.configure(top="enable_across_machines = true\nreport_timeout = '3s'",
                          peers=f'[hosts.evil]\nssh = "evil"\nssh_config = "{named}"\n')
        flipper = subprocess.Popen(["sh", "-c", loop], user=other_user.uid, group=other_user.gid,
                                   extra_groups=[], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(RACE_RUNS):
                line = refusal(hostrun.run("report", env=clean_env(tmp_path), cwd=tmp_path))
                # whichever way the path points now: at their file, or through their link/directory
                assert "hosts.evil.ssh_config" in line, line
                assert (expected in line or f"it is owned by {other_user.name}" in line
                        or "does not exist, and others can create it" in line), line
        finally:
            flipper.kill()
            flipper.wait()
        assert not marker.exists(), "the other user's ProxyCommand ran as root"
    finally:
        subprocess.run(["rm", "-rf", str(sticky), str(good)], check=False)
