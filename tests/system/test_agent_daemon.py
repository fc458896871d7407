"""The peer's report daemon (``agent serve``) against real OpenSSH peers: warm reports go through it
and a forwarded socket (no ssh, no Python start on the peer), whatever breaks is replaced, it idles
out leaving nothing, and only its own user gets an answer.

The peers' python is a wrapper that logs each start (``send``, ``serve``, ``report``), so a test can
say exactly which agent processes a report started there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from dispatch.core.settings import Settings
from dispatch.core.units import MiB
from dispatch.hosts.ssh import bundle
from dispatch.hosts.ssh.agentd import ask, local_socket
from dispatch.hosts.ssh.peer import PeerClient
from tests.conftest import Hostrun, _stop_masters, pid_alive


def setup(hostrun: Hostrun, peers: Any, idle: str = "30s", sshd_extra: str = "") -> Any:
    peer = peers("peer1", "127.0.0.2", slice="400M")
    if sshd_extra:
        peer.stop()
        with open(peer.sshd_config, "a") as fh:
            fh.write(sshd_extra + "\n")
        peer.start()
    wrapper = peer.root / "py"
    peer.starts = peer.root / "python-starts.log"
    wrapper.write_text(f'#!/bin/sh\ncase "$2" in -c) echo send;; *) echo "$3";; esac >> {peer.starts}\n'
                       'exec python3 "$@"\n')
    wrapper.chmod(0o755)
    hostrun.configure(top=f'agent_idle = "{idle}"',
                      peers=peer.host_table(f'python = "{wrapper}"'))
    return peer


def starts(peer: Any) -> list[str]:
    return peer.starts.read_text().split() if peer.starts.exists() else []


def report(hostrun: Hostrun) -> dict[str, Any]:
    proc = hostrun.run("report", "--json", "--host", "peer1", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (host,) = json.loads(proc.stdout)["hosts"]
    assert host["ok"], host
    data: dict[str, Any] = host["report"]
    return data


def client(hostrun: Hostrun) -> PeerClient:
    from dispatch.config import load_settings

    settings: Settings = load_settings(str(hostrun.config_path), {"HOME": str(hostrun.tmp)})
    return PeerClient(settings, settings.hosts["peer1"])


def direct(hostrun: Hostrun) -> dict[str, Any]:
    """One request straight to the local forwarded socket, as hostrun makes it."""
    return ask(local_socket(client(hostrun).ssh), {"agent": bundle.name(), "command": "report",
                                               "fallback": {}, "label": None, "peaks": False},
               time.monotonic() + 30)


def wait_until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


def test_warm_reports_go_through_the_daemon(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    first = report(hostrun)
    assert starts(peer) == ["send", "serve"]  # cold: sent, then the daemon started
    (pid,) = peer.daemon_pids()
    for _ in range(3):
        again = report(hostrun)
        assert again["slice"]["limit"] == 400 * MiB and again["config"] == str(peer.peer_config)
    assert starts(peer) == ["send", "serve"]  # no python started per report
    reply = direct(hostrun)
    assert reply["pid"] == pid and reply["served"] == 5  # the cold and three warm reports, this one
    assert set(reply["report"]) | {"host"} == set(first)  # the very shape of the per-call answer
    # Nothing runs on the peer between requests but the daemon, outside any ssh session.
    assert pid not in peer.pids()[:1] and (peer.home / ".cache/hostrun").stat().st_mode & 0o777 == 0o700
    for path in [*peer.daemon_sockets(), *peer.daemon_locks()]:
        assert path.lstat().st_uid == os.geteuid() and path.lstat().st_mode & 0o077 == 0, path
    forwarded = Path(local_socket(client(hostrun).ssh))
    assert forwarded.lstat().st_mode & 0o777 == 0o600


def test_same_answer_as_the_per_call_agent(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    peer.write_peer_config("400M", extra='gamble_size = "64M"')
    daemon = report(hostrun)
    assert peer.daemon_pids()
    hostrun.configure(top='agent_idle = "0"', peers=peer.host_table(f'python = "{peer.root / "py"}"'))
    per_call = report(hostrun)
    volatile = {"time", "load", "memory", "slice", "threads_free"}
    assert {k: v for k, v in daemon.items() if k not in volatile} == \
        {k: v for k, v in per_call.items() if k not in volatile}


def test_config_edit_on_the_peer_is_seen_by_the_daemon(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    assert report(hostrun)["slice"]["limit"] == 400 * MiB
    peer.write_peer_config("200M")
    assert report(hostrun)["slice"]["limit"] == 200 * MiB
    assert starts(peer).count("serve") == 1


def test_killed_daemon_is_replaced(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    report(hostrun)
    (pid,) = peer.daemon_pids()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), "the daemon gone")
    assert report(hostrun)["slice"]["limit"] == 400 * MiB
    (new,) = peer.daemon_pids()
    assert new != pid and starts(peer) == ["send", "serve", "serve"]
    assert direct(hostrun)["pid"] == new


def test_stale_local_socket_of_a_gone_master_is_replaced(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    report(hostrun)
    (pid,) = peer.daemon_pids()
    path = local_socket(client(hostrun).ssh)
    _stop_masters(hostrun.state_dir)
    wait_until(lambda: subprocess.run(["pgrep", "-f", path], capture_output=True).returncode != 0,
               "the master gone")
    if not os.path.exists(path):  # make sure a stale file is there, as a killed master leaves it
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(path)
    assert report(hostrun)["slice"]["limit"] == 400 * MiB
    assert peer.daemon_pids() == [pid]  # the same daemon, reached through a new forward
    assert direct(hostrun)["served"] == 3


def test_local_socket_of_another_user_is_not_used(hostrun: Hostrun, peers: Any, other_user: Any) -> None:
    peer = setup(hostrun, peers)
    report(hostrun)
    path = local_socket(client(hostrun).ssh)
    os.chown(path, other_user.uid, other_user.gid)
    assert report(hostrun)["slice"]["limit"] == 400 * MiB
    # Not used (it still led to the daemon): replaced by a forward of ours.
    assert os.lstat(path).st_uid == os.geteuid()
    assert direct(hostrun)["served"] == 3  # the cold report, the one after the replacement, this
    assert len(peer.daemon_pids()) == 1


def test_daemon_exits_after_agent_idle_leaving_nothing(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers, idle="1s")
    report(hostrun)
    assert peer.daemon_pids() and peer.daemon_sockets() and peer.daemon_locks()
    wait_until(lambda: not peer.daemon_leftovers(), "the daemon idled out")
    assert report(hostrun)["slice"]["limit"] == 400 * MiB  # and a new one starts on demand
    assert starts(peer).count("serve") == 2


def test_agent_idle_zero_means_per_call(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers, idle="0")
    report(hostrun)
    report(hostrun)
    assert starts(peer) == ["send", "report", "report"]
    assert not peer.daemon_leftovers()
    assert not os.path.exists(local_socket(client(hostrun).ssh))


def test_another_user_gets_no_answer(hostrun: Hostrun, peers: Any, other_user: Any) -> None:
    peer = setup(hostrun, peers)
    report(hostrun)
    (remote,) = peer.daemon_sockets()
    # Give the other user a way to the socket (a hard link in its home, the socket opened to all),
    # as a careless mode would: SO_PEERCRED still refuses it.
    link = other_user.home / "agent.sock"
    os.link(remote, link)
    os.chmod(remote, 0o666)
    try:
        probe = ("import json, socket, struct, sys\ns = socket.socket(socket.AF_UNIX)\n"
                 "s.connect(sys.argv[1])\nprint('connected')\n"
                 "b = json.dumps({'agent': sys.argv[2], 'command': 'report'}).encode()\n"
                 "try:\n    s.sendall(struct.pack('>I', len(b)) + b)\n    print(repr(s.recv(100)))\n"
                 "except (BrokenPipeError, ConnectionResetError):\n    print(repr(b''))\n")
        done = other_user.run(["/usr/bin/python3", "-I", "-c", probe, str(link), bundle.name()])
        # Connected, and closed without a word (or reset/broken: the request was left unread).
        assert done.stdout.split() == ["connected", "b''"], done
        os.chmod(remote, 0o600)
        theirs = ask(str(link), {"agent": bundle.name(), "command": "report", "fallback": {}},
                     time.monotonic() + 30)
        assert "report" in theirs  # the same link answers its own user
    finally:
        os.chmod(remote, 0o600)
        link.unlink()


def test_socket_dir_another_user_controls_is_refused(hostrun: Hostrun, peers: Any,
                                                     other_user: Any) -> None:
    peer = setup(hostrun, peers)
    short = Path(peer._short_socket_dir())
    short.mkdir(mode=0o777)
    os.chown(short, other_user.uid, other_user.gid)
    try:
        assert report(hostrun)["slice"]["limit"] == 400 * MiB  # answered per call
        assert report(hostrun)["slice"]["limit"] == 400 * MiB
        assert starts(peer) == ["send", "serve", "report", "report"]
        assert not peer.daemon_pids() and not list(short.iterdir())  # nothing served from there
    finally:
        short.rmdir()


def test_forwarding_refused_by_the_peer_falls_back_per_call(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers, sshd_extra="AllowStreamLocalForwarding no")
    assert report(hostrun)["slice"]["limit"] == 400 * MiB
    assert report(hostrun)["slice"]["limit"] == 400 * MiB
    # The daemon started once; the refused forward is remembered, so the second call goes per call
    # straight away, without retrying.
    assert starts(peer) == ["send", "serve", "report", "report"]


def test_concurrent_cold_reports_share_one_daemon(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    report(hostrun)  # the agent is sent; then everything the daemon path made is taken away
    (pid,) = peer.daemon_pids()
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not peer.daemon_leftovers(), "the daemon stopped")
    _stop_masters(hostrun.state_dir)
    procs = [hostrun.popen("report", "--json", "--host", "peer1")
             for _ in range(4)]
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and json.loads(out)["hosts"][0]["ok"], out
    assert len(peer.daemon_pids()) == 1
    path = local_socket(client(hostrun).ssh)
    assert not os.path.exists(path + ".off")  # none of them gave up on the daemon
    assert direct(hostrun)["served"] == 5  # all four went through it


def test_stuck_daemon_costs_at_most_half_the_report_timeout(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    hostrun.configure(top='agent_idle = "30s"\nreport_timeout = "4s"',
                      peers=peer.host_table(f'python = "{peer.root / "py"}"'))
    report(hostrun)
    (pid,) = peer.daemon_pids()
    os.kill(pid, signal.SIGSTOP)
    try:
        assert report(hostrun)["slice"]["limit"] == 400 * MiB  # per call, after 2 s
        assert report(hostrun)["slice"]["limit"] == 400 * MiB  # per call straight away
        assert starts(peer) == ["send", "serve", "report", "report"]
    finally:
        os.kill(pid, signal.SIGCONT)


def test_daemon_exits_when_its_socket_is_removed(hostrun: Hostrun, peers: Any) -> None:
    peer = setup(hostrun, peers)
    report(hostrun)
    (remote,) = peer.daemon_sockets()
    remote.unlink()  # "to stop it now: remove its socket"
    wait_until(lambda: not peer.daemon_leftovers(), "the daemon exited, its lock removed")
    assert report(hostrun)["slice"]["limit"] == 400 * MiB  # replaced on the next report
    assert starts(peer) == ["send", "serve", "serve"]
