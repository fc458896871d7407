"""Real OpenSSH peers for tests: an ``sshd`` with its own config, host key and user key in a temporary
directory, listening on a loopback address (127.0.0.2, ...). The peer is this same machine, but with its
own hostrun configuration, state directory, slice cgroup and home (set through sshd's ``SetEnv``),
so it has a ledger and slice of its own, as a second machine would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), from one read of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


class SshdPeer:
    def __init__(self, root: Path, name: str, address: str, peer_cgroup: str,
                 slice: str = "300M", extra_env: dict[str, str] | None = None,
                 netns: str | None = None) -> None:
        self.netns = netns
        self.root = root
        self.name = name
        self.address = address
        self.port = free_port("127.0.0.1") if netns else free_port(address)
        self.home = root / "home"
        self.state_dir = root / "state"
        self.peer_config = root / "peer-hosts.toml"
        self.cgroup = peer_cgroup
        self.home.mkdir(parents=True)
        host_key = root / "host_ed25519"
        self.host_pub = keygen(host_key)
        self.user_key = root / "id_ed25519"
        user_pub = keygen(self.user_key)
        (root / "authorized_keys").write_text(user_pub + "\n")
        self.write_peer_config(slice)
        env = {"HOSTRUN_CONFIG": str(self.peer_config), "HOME": str(self.home),
               "XDG_CACHE_HOME": str(self.home / ".cache"), "PYTHONDONTWRITEBYTECODE": "1",
               **(extra_env or {})}
        setenv = " ".join(f'"{k}={v}"' for k, v in env.items())
        self.sshd_config = root / "sshd_config"
        self.sshd_config.write_text(
            f"Port {self.port}\nListenAddress {address}\nHostKey {host_key}\n"
            f"PidFile {root / 'sshd.pid'}\nAuthorizedKeysFile {root / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\n"
            f"LogLevel ERROR\nSetEnv {setenv}\n"
        )
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(f"[{address}]:{self.port} {self.host_pub}\n")
        self.ssh_config = root / "ssh_config"
        self.ssh_config.write_text(
            f"Host {name}\n  HostName {address}\n  Port {self.port}\n  User root\n"
            f"  IdentityFile {self.user_key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def write_peer_config(self, slice: str, extra: str = "") -> None:
        self.peer_config.write_text(
            f'state_dir = "{self.state_dir}"\n{extra}\n[hosts.local]\nslice = "{slice}"\n'
            f'cgroup = "{self.cgroup}"\n'
        )

    def start(self) -> None:
        os.makedirs("/run/sshd", exist_ok=True)
        with open(self.root / "sshd.log", "wb") as log:
            # nsenter --net, not "ip netns exec": the latter also remounts /sys, which would hide the
            # cgroup hierarchy from the peer's hostrun.
            prefix = ["nsenter", f"--net=/var/run/netns/{self.netns}"] if self.netns else []
            self.process = subprocess.Popen([*prefix, SSHD, "-D", "-e", "-f", str(self.sshd_config)],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=log, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd on {self.address}:{self.port} did not start: "
                           f"{(self.root / 'sshd.log').read_text()}")

    def pids(self) -> list[int]:
        """The listener and every process below it (per-connection sshd, sessions, agents), and the
        report daemons started there (detached, so found by their lock files)."""
        if self.process is None:
            return []
        return [self.process.pid, *descendants(self.process.pid), *self.daemon_pids()]

    def daemon_locks(self) -> list[Path]:
        return sorted((self.home / ".cache" / "hostrun").glob("agent-*.lock"))

    def daemon_pids(self) -> list[int]:
        """Live report daemons (``agent serve``) of this peer, from the pid in their lock files."""
        found = []
        for lock in self.daemon_locks():
            try:
                pid = int(lock.read_text().split()[0])
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if b"serve" in fh.read():
                        found.append(pid)
            except (OSError, IndexError, ValueError):
                continue  # not written yet, or that daemon is gone
        return found

    def daemon_sockets(self) -> list[Path]:
        """Report daemon sockets (in the cache dir, or the short /tmp dir for long homes)."""
        directories = (self.home / ".cache" / "hostrun", Path(self._short_socket_dir()))
        return sorted(p for d in directories if d.is_dir() for p in d.glob("*.sock"))

    def _short_socket_dir(self) -> str:
        from dispatch.agent.serve import paths

        old = os.environ.get("HOME")
        os.environ["HOME"] = str(self.home)
        try:
            return os.path.dirname(paths(str(self.home / ("x" * 120)))[0])
        finally:
            if old is None:
                del os.environ["HOME"]
            else:
                os.environ["HOME"] = old

    def _signal_all(self, sig: int) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass  # a session ended between listing and signalling

    def freeze(self) -> None:
        self._signal_all(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_all(signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self.process is not None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        deadline = time.monotonic() + 10
        while self.daemon_pids() and time.monotonic() < deadline:
            time.sleep(0.05)  # a report daemon removes its socket and lock on SIGTERM
        for pid in self.daemon_pids():
            os.kill(pid, signal.SIGKILL)
        short = self._short_socket_dir()
        if os.path.isdir(short) and not os.listdir(short):
            os.rmdir(short)

    def daemon_leftovers(self) -> list[str]:
        """What report daemons left: processes, sockets, locks (the teardown's leak check)."""
        return [*(f"pid {p}" for p in self.daemon_pids()), *map(str, self.daemon_sockets()),
                *map(str, self.daemon_locks())]

    def host_table(self, extra: str = "") -> str:
        """The controller's [hosts.NAME] table for this peer."""
        return f'[hosts.{self.name}]\nssh = "{self.name}"\nssh_config = "{self.ssh_config}"\n{extra}\n'


class NetNs:
    """A network namespace joined to this one by a veth pair, so a peer inside it can be cut off.

    The addresses (10.253.N.1 here, 10.253.N.2 inside) exist only on this veth pair, which the test
    creates and deletes itself: no traffic leaves this machine.
    """

    def __init__(self, index: int) -> None:
        tag = f"{os.getpid() % 10000}{index}"
        self.name = f"hrns{tag}"
        self.outer = f"hrva{tag}"
        self.inner = f"hrvb{tag}"
        self.host_address = f"10.253.{index}.1"
        self.address = f"10.253.{index}.2"

    def _ip(self, *args: str, inside: bool = False) -> None:
        prefix = ["ip", "netns", "exec", self.name] if inside else []
        subprocess.run([*prefix, "ip", *args], check=True, capture_output=True)

    def create(self) -> None:
        self._ip("netns", "add", self.name)
        self._ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        self._ip("link", "set", self.inner, "netns", self.name)
        self._ip("addr", "add", f"{self.host_address}/30", "dev", self.outer)
        self._ip("link", "set", self.outer, "up")
        self._ip("addr", "add", f"{self.address}/30", "dev", self.inner, inside=True)
        self._ip("link", "set", self.inner, "up", inside=True)
        self._ip("link", "set", "lo", "up", inside=True)

    def cut(self) -> None:
        self._ip("link", "set", self.outer, "down")

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.outer], check=False, capture_output=True)
