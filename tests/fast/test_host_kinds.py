"""Host kinds: the ``kind`` key, each kind's key table driving both parsers, the registry, and the
``Host`` questions the dispatcher asks (no root, sshd or second user: none is contacted)."""

from __future__ import annotations

import json
import marshal
import os
from pathlib import Path
from typing import Any

import pytest

from dispatch.config.model import validate_file
from dispatch.core.configfile import settings_from_dict
from dispatch.core.errors import ConfigError, OverPeerCapError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.settings import Settings
from dispatch.core.units import GiB, MiB
from dispatch.hosts import kinds
from dispatch.hosts.kinds import KINDS, host_for
from dispatch.hosts.local import LocalHost
from dispatch.hosts.ssh.kind import SshPeer
from dispatch.hosts.ssh.peer import PeerClient
from dispatch.placement.dispatcher import Decision, Job, decide
from dispatch.placement.reports import HostReading
from tests.support.toykind import ToyHost


def load(tmp_path: Path, body: str) -> Settings:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(body)
    return validate_file(str(cfg))


def refused(tmp_path: Path, body: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, body)
    assert caught.value.exit_code == ExitCode.USAGE
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "hosts.toml") + ": ")
    return message.split(": ", 1)[1]


# ----------------------------------------------------------------------------- the kind key
def test_kind_absent_is_inferred_from_the_name_and_explicit_is_the_same(tmp_path: Path) -> None:
    inferred = load(tmp_path, "[hosts.local]\nslice = '1G'\n[hosts.box]\nssh = 'me@box'\n")
    explicit = load(tmp_path, "[hosts.local]\nkind = 'local'\nslice = '1G'\n"
                              "[hosts.box]\nkind = 'ssh'\nssh = 'me@box'\n")
    assert [(h.name, h.kind) for h in inferred.hosts.values()] == [("local", "local"), ("box", "ssh")]
    assert inferred.hosts == explicit.hosts
    assert inferred.hosts["box"].options == {"ssh": "me@box"}
    assert type(host_for(inferred, "local")) is LocalHost
    assert type(host_for(inferred, "box")) is SshPeer
    assert host_for(inferred, "local").is_here and not host_for(inferred, "box").is_here


@pytest.mark.parametrize(("body", "line"), [
    ("[hosts.box]\nkind = 'pbs'\n", "hosts.box.kind: unknown kind 'pbs' (known: local, slurm, ssh)"),
    ("[hosts.local]\nkind = 'ssh'\nssh = 'x'\n",
     "hosts.local.kind: local is this machine, so its kind is local, not 'ssh'"),
    ("[hosts.box]\nkind = 'local'\n",
     "hosts.box.kind: kind 'local' is this machine, which is [hosts.local]; another name is a peer"),
    ("[hosts.box]\nkind = 3\n", "hosts.box.kind: Input should be a valid string"),
])
def test_a_bad_kind_is_one_line_naming_the_host(tmp_path: Path, body: str, line: str) -> None:
    assert refused(tmp_path, body) == line


def test_the_agent_leaves_out_hosts_of_kinds_it_does_not_know() -> None:
    """The agent on a peer parses its own file knowing only ``local``; a mismatch is still refused."""
    raw = {"hosts": {"local": {"slice": "1G", "mystery": 1}, "box": {"ssh": "me@box"},
                     "farm": {"kind": "slurm", "partition": "x"}}}
    settings = settings_from_dict(raw, "hosts.toml")
    assert list(settings.hosts) == ["local"] and settings.local.slice_bytes == GiB
    with pytest.raises(ConfigError, match=r"hosts\.local\.kind: local is this machine"):
        settings_from_dict({"hosts": {"local": {"kind": "ssh"}}}, "hosts.toml")


# ------------------------------------------------------------- a kind's table drives both parsers
# The toy kind (tests/support/toykind.py) is registered here only; tests/fast/test_toy_kind.py runs it.
@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "toy", ToyHost)


TOY = "[hosts.farm]\nkind = 'toy'\nqueue = 'q1'\nlimit = '2G'\ntoy_config = '~/toy.conf'\n"


def test_a_registered_kind_is_parsed_from_its_table_alone(tmp_path: Path, toy: None) -> None:
    settings = load(tmp_path, TOY)
    farm = settings.hosts["farm"]
    assert (farm.kind, farm.files) == ("toy", ("toy_config",))
    assert farm.options == {"queue": "q1", "limit": 2 * GiB,
                            "toy_config": os.path.expanduser("~/toy.conf")}
    assert type(host_for(settings, "farm")) is ToyHost
    # the plain parser, given the same kinds, builds the same settings (the agent's path)
    raw = {"hosts": {"farm": {"kind": "toy", "queue": "q1", "limit": "2G", "toy_config": "~/toy.conf"}}}
    assert settings_from_dict(raw, str(tmp_path / "hosts.toml"), kinds.specs()) == settings
    # its environment variable is derived from its table too
    over = settings.with_env_overrides({"TOY_LIMIT": "3G", "HOME": str(tmp_path)})
    assert over.hosts["farm"].options["limit"] == 3 * GiB
    with pytest.raises(ConfigError, match=r"^TOY_LIMIT: "):
        settings.with_env_overrides({"TOY_LIMIT": "lots", "HOME": str(tmp_path)})
    # and the config cache round-trips it
    data = marshal.loads(marshal.dumps(over.to_normalized()))
    assert Settings.from_normalized(data) == over


@pytest.mark.parametrize(("body", "line"), [
    ("[hosts.farm]\nkind = 'toy'\nqueue = 'q'\nlimit = 'lots'\n", "hosts.farm.limit: not a size"),
    ("[hosts.farm]\nkind = 'toy'\nqueue = 'q'\nlimit = '1K'\n", "hosts.farm.limit: '1K' is too small"),
    ("[hosts.farm]\nkind = 'toy'\n", "hosts.farm: a toy needs queue = 'name'"),
    ("[hosts.farm]\nkind = 'toy'\nqueue = 'q'\nssh = 'x'\n", "hosts.farm: ssh is not a key of kind toy"),
    ("[hosts.local]\nqueue = 'q'\n", "hosts.local: queue is for peers; local is this machine"),
    ("[hosts.box]\nssh = 'x'\nlimit = '1G'\n", "hosts.box: limit is not a key of kind ssh"),
    ("[hosts.farm]\nkind = 'toy'\nqueue = 'q'\nlimt = '1G'\n", "hosts.farm.limt: unknown key"),
])
def test_a_registered_kinds_keys_are_validated(tmp_path: Path, toy: None, body: str, line: str) -> None:
    assert refused(tmp_path, body).startswith(line)


def test_without_the_kind_registered_its_keys_are_unknown(tmp_path: Path) -> None:
    assert refused(tmp_path, TOY).startswith("hosts.farm.queue: unknown key")


# ------------------------------------------------------------------------ the Host questions
def ssh_settings(tmp_path: Path, extra: str = "") -> Settings:
    return load(tmp_path, f"state_dir = '{tmp_path}/state'\nenable_across_machines = true\n"
                          f"[hosts.local]\n[hosts.box]\nssh = 'me@box'\n{extra}")


@pytest.mark.parametrize(("cap", "default_cap", "local", "ssh"), [
    (None, None, None, 4 * GiB),  # an uncapped job runs under peer_memory_cap there
    (None, 2 * GiB, 2 * GiB, 2 * GiB),
    (None, 8 * GiB, 8 * GiB, 4 * GiB),  # a default gives way to the peer's bound
    (GiB, 8 * GiB, GiB, GiB),
    (8 * GiB, None, 8 * GiB, 8 * GiB),  # an explicit -m is kept (and refused: cap_problem)
])
def test_job_cap_is_one_rule_per_kind(tmp_path: Path, cap: int | None, default_cap: int | None,
                                      local: int | None, ssh: int | None) -> None:
    settings = ssh_settings(tmp_path, "peer_memory_cap = '4G'\n")
    assert host_for(settings, "local").job_cap(cap, default_cap) == local
    assert host_for(settings, "box").job_cap(cap, default_cap) == ssh


def test_only_the_peer_bounds_the_cap_249(tmp_path: Path) -> None:
    settings = ssh_settings(tmp_path, "peer_memory_cap = '4G'\n")
    here, box = host_for(settings, "local"), host_for(settings, "box")
    assert here.cap_problem(8 * GiB) is None
    here.check_cap(8 * GiB)
    assert box.cap_problem(4 * GiB) is None
    assert box.cap_problem(8 * GiB) == "cap 8.0 GiB exceeds its peer_memory_cap (4.0 GiB)"
    with pytest.raises(OverPeerCapError) as caught:
        box.check_cap(8 * GiB)
    assert str(caught.value) == "--peer=box: cap 8.0 GiB exceeds its peer_memory_cap (4.0 GiB)"
    assert (box.pending_estimate(None), here.pending_estimate(None)) == (4 * GiB, 512 * MiB)


def test_the_fallback_keys_come_from_the_shared_table(tmp_path: Path) -> None:
    settings = ssh_settings(tmp_path, "default_cap = '1G'\ncgroup = '/x/'\npeer_memory_cap = '4G'\n")
    fallback = json.loads(PeerClient(settings, settings.hosts["box"]).fallback())
    assert fallback == {"default_cap": GiB, "cgroup": "/x"}  # not the ssh kind's own keys


def reading(host: str, free: int) -> HostReading:
    report = {"slice": {"limit": 8 * GiB, "free": free},
              "settings": {"default_cap": None, "gamble_size": 512 * MiB}, "label_peak": None}
    return HostReading(host, report, None, 0.01)


@pytest.mark.parametrize(("free_here", "free_box", "verdict", "host", "action"), [
    (4 * GiB, 4 * GiB, "run", "local", "local"),
    (0, 4 * GiB, "run", "box", "peer"),
    (0, 0, "queue", "local", "queue"),
])
def test_a_decision_names_a_host_and_a_verdict_and_says_the_old_action(
        tmp_path: Path, free_here: int, free_box: int, verdict: str, host: str, action: str) -> None:
    settings = ssh_settings(tmp_path)
    decision = decide(settings, Job("job", cap=GiB), [reading("local", free_here), reading("box", free_box)],
                      {})
    assert (decision.verdict, decision.host, decision.action) == (verdict, host, action)
    data: dict[str, Any] = decision.as_dict()
    assert list(data) == ["action", "host", "exit_code", "reasons", "judgements"]
    assert data["action"] == action and data["host"] == host


def test_waiting_on_the_only_peer_that_could_hold_it_is_still_action_peer() -> None:
    decision = Decision("queue", "box", 0, [], [], here=False)
    assert decision.action == "peer"
    assert Decision("refuse", None, 243, [], []).action == "refuse"


def test_the_hook_table_line_is_what_each_kind_says_of_itself(tmp_path: Path) -> None:
    """The agent hooks' table asks the host (``Host.summary``): nothing there branches on a kind."""
    from dispatch.hooks import table

    settings = load(tmp_path, "[hosts.farm]\nkind = 'slurm'\npartition = 'x'\n")
    machine = {"load": [1.25, 1.0, 1.0], "cores": 8, "heavy_threads": 6, "threads_free": 5,
               "memory": {"available_for_jobs": 3 * GiB}, "slice": {"free": GiB, "limit": 4 * GiB},
               "queue_length": 1, "running": [{}, {}], "gpus": [], "gpu_error": None}
    cluster = {"kind": "slurm", "running": [{}], "queue_length": 2,
               "totals": {"nodes_up": 3, "nodes": 4, "memory_free": 96 * GiB, "gpus_total": 8,
                          "most_free_node": {"memory": 40 * GiB}}}
    text = table.text(settings, [HostReading("local", machine, None, 0.1),
                                 HostReading("farm", cluster, None, 0.2),
                                 HostReading("gone", None, "connection refused", 0.3)], peers=True)
    lines = text.splitlines()
    assert lines[1] == ("- local: load 1.2 on 8 cores, 5 of 6 heavy threads free, memory available "
                        "3.0 GiB, slice 1.0 GiB free of 4.0 GiB, 1 queued, 2 running, GPUs: none")
    assert lines[2] == ("- farm: Slurm cluster, 3 of 4 nodes up, 96.0 GiB free to allocate (most on one "
                        "node 40.0 GiB), 1 running, 2 pending, 8 GPUs")
    assert lines[3] == "- gone: could not read: connection refused"
