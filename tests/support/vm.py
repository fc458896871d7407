"""A real systemd + cgroup v2 machine for the tests: Debian 12 booted in qemu, reached over ssh.

These machines run cgroup v1 without systemd; most of hostrun's users run the opposite. So the `vm`
tests boot a real kernel (Debian's cloud kernel) with systemd as PID 1 and the unified hierarchy, with
root and two normal users (``dev``, uid 1000; ``dev2``, uid 1001) whose ssh logins get a systemd user
session (``libpam-systemd``), memory delegated to ``user@UID.service`` as on every workstation.

The image is built once and cached (keyed on its package list and this file's build recipe):
``debootstrap --variant=minbase`` of bookworm from the mirror apt already uses (~1.5 min), configured
in place, then ``mkfs.ext4 -d`` turns the tree into a raw disk image (~5 s). Each boot gets its own
copy-on-write qcow2 overlay. qemu dies with the test process, however it ends (``PR_SET_PDEATHSIG``:
``dies_with_this_process``). qemu runs in software emulation (``-accel tcg``; nested KVM hangs at
boot here) with user-mode networking restricted to the host (``restrict=on``): nothing leaves the VM,
and its sshd is forwarded to a free port on 127.0.0.1. Host keys are checked (the image's key goes into
a known_hosts file written per boot).

hostrun is copied in as source plus the site-packages it needs from this virtualenv (the guest's
Python is 3.11, as here), under ``/opt/hostrun``, with ``/usr/local/bin/hostrun`` running it; or used
as a bare peer (only ``python3`` and ``rsync``: the agent ships itself).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

SUITE = "bookworm"
PACKAGES = (
    "systemd-sysv", "dbus", "libpam-systemd", "udev", "openssh-server", "python3", "rsync", "procps",
    "iproute2", "kmod", "initramfs-tools", "linux-image-cloud-amd64", "polkitd", "pipx",
)
USERS = (("dev", 1000), ("dev2", 1001))
# Bump when the configuration steps below change: the cache key covers it.
RECIPE = 2
IMAGE_SIZE = "3G"
MEMORY_MIB = 2048
SITE_PACKAGES = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions.py",
                 "typing_inspection", "rich", "markdown_it", "mdurl", "pygments")
# Units that cost boot time and do nothing for the tests.
MASKED = ("e2scrub_reap.service", "systemd-networkd-wait-online.service", "apt-daily.timer",
          "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer", "getty@tty1.service")


class VmError(Exception):
    """The image could not be built or the machine did not come up (the message says where)."""


def missing_tools() -> str | None:
    """Why no VM can be booted here, or None."""
    for tool in ("qemu-system-x86_64", "qemu-img"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup installs qemu-system-x86 and qemu-utils as root)"
    return None


def cache_root() -> Path:
    base = os.environ.get("HOSTRUN_VM_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "hostrun-test-vm"


def debian_mirror() -> str:
    """The Debian mirror apt already uses (deb822 ``URIs:`` or a one-line ``deb`` entry)."""
    candidates = [*sorted(Path("/etc/apt/sources.list.d").glob("*.sources")), Path("/etc/apt/sources.list")]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1] \
                    and "debian" in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and SUITE in words[2:3] and "debian" in words[1]:
                return words[1]
    return "http://deb.debian.org/debian"


def image_key() -> str:
    digest = hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)} {USERS} {RECIPE} {IMAGE_SIZE}".encode())
    return digest.hexdigest()[:16]


class Image:
    """A built image: ``base.img`` (raw ext4), the kernel and initrd, the ssh key that logs in as
    every user, and the guest's ed25519 host key."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.disk = directory / "base.img"
        self.kernel = directory / "vmlinuz"
        self.initrd = directory / "initrd.img"
        self.key = directory / "id_ed25519"
        self.host_key = (directory / "host_ed25519.pub").read_text().split()[:2]


def ensure_image(log: Path | None = None) -> Image:
    """The cached image, built first when missing (root needed for that: debootstrap). A lock keeps
    two test sessions from building it twice."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / image_key()
    if (final / "ready").exists():
        return Image(final)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "ready").exists():
            return Image(final)
        if os.geteuid() != 0:
            raise VmError(f"no VM image in {root}, and building one needs root (debootstrap)")
        if shutil.which("debootstrap") is None:
            raise VmError("debootstrap is not installed (scripts/setup installs it as root)")
        work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
        try:
            _build(work, log or work / "build.log")
            shutil.rmtree(final, ignore_errors=True)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        (final / "ready").write_text(image_key() + "\n")
        for old in root.iterdir():  # images of other recipes
            if old.is_dir() and old != final and not old.name.startswith("build-"):
                shutil.rmtree(old, ignore_errors=True)
    return Image(final)


def _run(argv: list[str], log: Path, **kw: object) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise VmError(f"{argv[0]} failed ({done.returncode}) building the VM image:\n{tail}")


def _build(work: Path, log: Path) -> None:
    rootfs = work / "rootfs"
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs),
          debian_mirror()], log)
    etc = rootfs / "etc"
    (etc / "hostname").write_text("hostrun-vm\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 hostrun-vm\n")
    (etc / "fstab").write_text("/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
    network = etc / "systemd" / "network"
    network.mkdir(parents=True, exist_ok=True)
    (network / "10-nic.network").write_text("[Match]\nName=en* eth*\n[Network]\nDHCP=ipv4\n")
    _run(["chroot", str(rootfs), "systemctl", "enable", "systemd-networkd.service"], log)
    _run(["chroot", str(rootfs), "systemctl", "mask", *MASKED], log)
    _run(["chroot", str(rootfs), "systemd-machine-id-setup"], log)
    _run(["chroot", str(rootfs), "passwd", "--delete", "root"], log)
    (etc / "ssh" / "sshd_config.d" / "hostrun-tests.conf").write_text(
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "UseDNS no\nPrintMotd no\nMaxSessions 64\nMaxStartups 64\n")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hostrun-tests",
                    "-f", str(work / "id_ed25519")], check=True)
    public = (work / "id_ed25519.pub").read_text()
    homes = [("root", 0, rootfs / "root")]
    for name, uid in USERS:
        _run(["chroot", str(rootfs), "useradd", "--create-home", "--uid", str(uid), "--shell",
              "/bin/bash", name], log)
        homes.append((name, uid, rootfs / "home" / name))
    for _, uid, home in homes:
        ssh = home / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        (ssh / "authorized_keys").write_text(public)
        for path in (ssh, ssh / "authorized_keys", home):
            os.chown(path, uid, uid)
    # pipx's shared environment, made now (natively) for each login: in the emulated guest, creating
    # a venv with pip takes about a minute, and ``pipx install`` would make it first.
    for name, _, home in homes:
        _run(["chroot", str(rootfs), "runuser", "-u", name, "--", "python3", "-m", "venv",
              f"/{home.relative_to(rootfs)}/.local/pipx/shared"], log)
    shutil.copy(etc / "ssh" / "ssh_host_ed25519_key.pub", work / "host_ed25519.pub")
    boot = rootfs / "boot"
    shutil.copy(next(boot.glob("vmlinuz-*")), work / "vmlinuz")
    shutil.copy(next(boot.glob("initrd.img-*")), work / "initrd.img")
    _run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(rootfs), str(work / "base.img"), IMAGE_SIZE], log)
    shutil.rmtree(rootfs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class _Launcher:
    """Starts a process that dies with this one (SIGKILL included): a pytest killed by a timeout
    must not leave qemu eating a core for an hour.

    The child sets ``PR_SET_PDEATHSIG`` (SIGKILL) before it execs. The kernel sends that signal
    when the *thread* that forked the child ends, not the process, and the session's VM is booted
    in a thread that ends once it is up (``conftest._VmStart``; ``test_vm_first_minute`` boots in
    its own thread): so every such process is forked by this one thread, which waits for requests
    as long as the process lives. The child checks its parent after the ``prctl``: a parent gone
    before it was set (the signal would never come) ends it at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._prctl: Any = None

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(argv, **kw)`` forked by the launcher thread, the child bound to die with
        this process."""
        with self._lock:
            if self._thread is None:
                import ctypes

                # Looked up here, not in the child: after a fork only the call itself is made.
                self._prctl = ctypes.CDLL(None, use_errno=True).prctl
                self._thread = threading.Thread(target=self._serve, name="vm-launcher", daemon=True)
                self._thread.start()
        parent = os.getpid()
        prctl = self._prctl

        def bind_to_parent() -> None:  # in the child, between fork and exec
            if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
                os._exit(127)

        done: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((lambda: subprocess.Popen(argv, preexec_fn=bind_to_parent, **kw), done))
        return done.result()

    def _serve(self) -> None:
        while True:
            start, done = self._requests.get()
            try:
                done.set_result(start())
            except BaseException as exc:  # the caller's Popen raises it
                done.set_exception(exc)


dies_with_this_process = _Launcher().popen


class VM:
    """One booted machine: ``run(user, argv)`` over ssh, ``freeze``/``thaw`` (SIGSTOP/SIGCONT of
    qemu: the whole machine stops, kernel and clock included), ``power_off``/``boot`` again."""

    def __init__(self, image: Image, workdir: Path, memory_mib: int = MEMORY_MIB) -> None:
        self.image = image
        self.dir = workdir
        self.memory_mib = memory_mib  # a boot parameter: the image (and its key) is the same at any size
        self.overlay = workdir / "overlay.qcow2"
        self.console = workdir / "console.log"
        self.ssh_config = workdir / "ssh_config"
        self.known_hosts = workdir / "known_hosts"
        self.port = 0
        self.qemu: subprocess.Popen[bytes] | None = None
        self.boot_seconds = 0.0

    def boot(self, timeout: float = 240.0) -> None:
        if not self.overlay.exists():
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image.disk),
                            "-F", "raw", str(self.overlay)], check=True)
        self.port = free_port()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {' '.join(self.image.host_key)}\n")
        hosts = [("vm-root", "root")] + [(f"vm-{name}", name) for name, _ in USERS]
        self.ssh_config.write_text("".join(
            f"Host {alias}\n  HostName 127.0.0.1\n  Port {self.port}\n  User {user}\n"
            f"  IdentityFile {self.image.key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 10\n  LogLevel ERROR\n"
            "  ServerAliveInterval 5\n  ServerAliveCountMax 3\n"
            # A login costs 2-5 s in the emulated guest (sshd, PAM, logind); a channel of a kept
            # connection ~0.2 s. The master's session also keeps the user's manager running, as a
            # logged-in user's is.
            f"  ControlMaster auto\n  ControlPath {self.dir}/cm-%r\n  ControlPersist 1800\n"
            for alias, user in hosts))
        os.chmod(self.image.key, 0o600)
        argv = [
            "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2",
            "-m", str(self.memory_mib), "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
            "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
            "-append", "root=/dev/vda rw console=ttyS0 quiet mitigations=off",
            "-drive", f"file={self.overlay},if=virtio,format=qcow2,cache=unsafe",
            "-nic", f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-:22",
        ]
        started = time.monotonic()
        with open(self.console, "ab") as out:
            self.qemu = dies_with_this_process(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                               start_new_session=True)
        deadline = started + timeout
        while True:
            if self.qemu.poll() is not None:
                raise VmError(f"qemu exited ({self.qemu.returncode}) while booting:\n{self.console_tail()}")
            probe = self.ssh("root", ["true"], timeout=30, check=False)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                self.power_off()
                raise VmError(f"no ssh after {timeout:g} s:\n{self.console_tail()}")
            time.sleep(1)
        self.boot_seconds = time.monotonic() - started

    def console_tail(self, size: int = 3000) -> str:
        try:
            return self.console.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def ssh_argv(self, user: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), f"vm-{user}"]

    def ssh(self, user: str, argv: list[str] | str, timeout: float = 120, check: bool = True,
            input: str | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a command in the guest as ``user``: a list is quoted for the login shell, a string is
        the shell command itself."""
        import shlex

        command = argv if isinstance(argv, str) else shlex.join(argv)
        done = subprocess.run([*self.ssh_argv(user), "--", command], text=True, capture_output=True,
                              timeout=timeout, check=False, input=input, **kw)  # type: ignore[call-overload]
        if check and done.returncode != 0:
            raise VmError(f"in the VM as {user}: {command!r} exited {done.returncode}:\n"
                          f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done  # type: ignore[no-any-return]

    def put(self, user: str, source: Path, target: str) -> None:
        """Copy a local directory's contents into ``target`` in the guest (tar over ssh)."""
        tar = subprocess.Popen(["tar", "-C", str(source), "-cf", "-", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        done = subprocess.run([*self.ssh_argv(user), "--", f"mkdir -p {target} && tar -C {target} -xf -"],
                              stdin=tar.stdout, capture_output=True, text=True, check=False, timeout=300)
        tar.stdout.close()
        tar.wait()
        if done.returncode != 0 or tar.returncode != 0:
            raise VmError(f"copying {source} into the VM failed: {done.stderr}")

    def freeze(self) -> None:
        assert self.qemu is not None
        os.kill(self.qemu.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.qemu is not None
        os.kill(self.qemu.pid, signal.SIGCONT)

    @property
    def running(self) -> bool:
        return self.qemu is not None and self.qemu.poll() is None

    def close_connections(self) -> None:
        for user in ["root", *(name for name, _ in USERS)]:
            subprocess.run([*self.ssh_argv(user), "-O", "exit"], capture_output=True, check=False,
                           timeout=30)

    def power_off(self) -> None:
        """Pull the plug: qemu is killed (the disk overlay stays for a later ``boot``)."""
        if self.qemu is None:
            return
        self.close_connections()
        try:
            os.killpg(self.qemu.pid, signal.SIGCONT)
            os.killpg(self.qemu.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.qemu.wait()
        self.qemu = None

    def destroy(self) -> None:
        self.power_off()
        self.overlay.unlink(missing_ok=True)


def install_hostrun(vm: VM, repo: Path) -> None:
    """hostrun's source and the site-packages it needs, from this checkout and virtualenv, into
    ``/opt/hostrun`` in the guest; ``/usr/local/bin/hostrun`` runs it with the guest's python3."""
    import site  # noqa: F401 - only to be sure the import system is complete
    import sysconfig

    staging = Path(tempfile.mkdtemp(prefix="hostrun-vm-stage-"))
    try:
        lib = staging / "lib"
        lib.mkdir()
        shutil.copytree(repo / "dispatch", lib / "dispatch",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        purelib = Path(sysconfig.get_paths()["purelib"])
        for name in SITE_PACKAGES:
            src = purelib / name
            if src.is_dir():
                shutil.copytree(src, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.exists():
                shutil.copy(src, lib / name)
            else:
                raise VmError(f"{name} is not installed in {purelib} ({sys.executable})")
        vm.put("root", staging, "/opt/hostrun")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    vm.ssh("root", "printf '#!/bin/sh\\nPYTHONPATH=/opt/hostrun/lib exec python3 -m dispatch \"$@\"\\n' "
                   "> /usr/local/bin/hostrun && chmod 755 /usr/local/bin/hostrun && "
                   "chmod -R a+rX /opt/hostrun && python3 -m compileall -q /opt/hostrun/lib/dispatch")


TEST_TOOLS = ("pytest>=7", "mypy>=1.8", "ruff>=0.4", "setuptools>=77")


def build_wheelhouse(repo: Path, target: Path) -> Path:
    """hostrun's wheel, built from this checkout, and the wheels of its dependencies and test tools
    for the guest (CPython 3.11, manylinux x86_64), downloaded by this virtualenv's pip: what
    ``pipx install`` and ``scripts/setup`` need in a VM that reaches no index. Returns the wheel."""
    target.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip"]
    deps = subprocess.run([*base, "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
                           "--implementation", "cp", "--platform", "manylinux2014_x86_64", "--platform",
                           "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", "-d",
                           str(target), "pydantic>=2.5", "rich>=13", *TEST_TOOLS], capture_output=True,
                          text=True,
                          check=False, timeout=600)
    if deps.returncode != 0:
        raise VmError(f"pip download of hostrun's dependencies failed: {deps.stderr[-1500:]}")
    built = subprocess.run([*base, "wheel", "-q", "--no-deps", "-w", str(target), str(repo)],
                           capture_output=True, text=True, check=False, timeout=600)
    if built.returncode != 0:
        raise VmError(f"building hostrun's wheel failed: {built.stderr[-1500:]}")
    (wheel,) = target.glob("hostrun-*.whl")
    return wheel


def copy_checkout(vm: VM, user: str, repo: Path, target: str) -> None:
    """This checkout's files (tracked, and untracked but not ignored: what a clone would have plus
    the change at hand) into ``target`` in the guest, as ``user``."""
    files = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, check=True).stdout
    tar = subprocess.Popen(["tar", "-C", str(repo), "--null", "-T", "-", "-cf", "-"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert tar.stdin is not None and tar.stdout is not None
    tar.stdin.write(files)
    tar.stdin.close()
    done = subprocess.run([*vm.ssh_argv(user), "--", f"mkdir -p {target} && tar -C {target} -xf -"],
                          stdin=tar.stdout, capture_output=True, text=True, check=False, timeout=300)
    tar.stdout.close()
    tar.wait()
    if done.returncode != 0 or tar.returncode != 0:
        raise VmError(f"copying the checkout into the VM failed: {done.stderr}")
