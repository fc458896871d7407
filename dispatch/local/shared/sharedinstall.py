"""``hostrun shared install|uninstall``: the administrator's one-time set-up of a shared slice.

Two units in ``/etc/systemd/system``: ``hostrun-shared.socket`` (``/run/hostrun/shared.sock``, mode
0660, owned by root and the group) and ``hostrun-shared.service``, which systemd starts on the first
connection: ``python3 -m dispatch.local.shared.sharedd`` (the slice's admission engine) from this very
installation, run as root, its ledger in ``/var/lib/hostrun-shared`` (``StateDirectory=``, root's
alone). So the
code root runs must be root's alone (every directory from ``/`` down, and the interpreter): a
package a user could edit would be that user's root shell. (It runs with the working directory
``/``, which ``-m`` puts first on ``sys.path``.) The size is the administrator's, fixed
in the unit: users' ``slice``/``reserve`` keys do not apply to a shared slice.

The service restarts on failure, every ``RESTART_SEC`` seconds with no start limit: a start limit
reached would fail the socket and remove it, closing the shared slice to every member until an
administrator came (a restarted engine keeps the bookings of its ledger, and ends only the jobs no
booking names: ``sharedd.SharedEngine.sweep``).
Its descriptor limit is well above the daemon's connection limit, so accepting never runs out.
"""

from __future__ import annotations

import os
import sys

import dispatch
from dispatch.capping.shared import SOCKET_DIR, SOCKET_PATH, root_only
from dispatch.core.errors import NotRunError, UsageError
from dispatch.core.units import format_size
from dispatch.local.shared.sharedd import STATE_DIR

MYPY = False
if MYPY:
    from collections.abc import Callable

UNIT_DIR = "/etc/systemd/system"
SOCKET_UNIT = "hostrun-shared.socket"
SERVICE_UNIT = "hostrun-shared.service"
RESTART_SEC = 2  # a crash loop costs one interpreter start per 2 s, and never closes the socket
NOFILE = 8192  # the daemon's descriptors: MAX_CLIENTS (1024) connections and what requests open


def _package_root() -> str:
    """The directory holding the ``dispatch`` package this code was imported from."""
    return os.path.dirname(os.path.dirname(os.path.abspath(dispatch.__file__)))


def unit_texts(python: str, pythonpath: str, group: str, size: int, slice_unit: str) -> dict[str, str]:
    """The two unit files, by name."""
    socket_unit = (
        "[Unit]\n"
        f"Description=hostrun shared slice: the socket of group {group}\n\n"
        "[Socket]\n"
        f"ListenStream={SOCKET_PATH}\n"
        "SocketUser=root\n"
        f"SocketGroup={group}\n"
        "SocketMode=0660\n"
        "DirectoryMode=0755\n"
        "RemoveOnStop=yes\n\n"
        "[Install]\n"
        "WantedBy=sockets.target\n"
    )
    service_unit = (
        "[Unit]\n"
        f"Description=hostrun shared slice: admission and job scopes for group {group}\n"
        f"Requires={SOCKET_UNIT}\n"
        f"After={SOCKET_UNIT}\n"
        "StartLimitIntervalSec=0\n\n"
        "[Service]\n"
        f"ExecStart={python} -m dispatch.local.shared.sharedd --slice {slice_unit} --size {size} "
        f"--group {group} --state-dir {STATE_DIR}\n"
        f"StateDirectory={os.path.basename(STATE_DIR)}\n"
        "StateDirectoryMode=0700\n"
        "Restart=on-failure\n"
        f"RestartSec={RESTART_SEC}s\n"
        f"LimitNOFILE={NOFILE}\n"
        f"Environment=PYTHONPATH={pythonpath}\n"
        "Environment=PYTHONDONTWRITEBYTECODE=1\n"
        "WorkingDirectory=/\n"
    )
    return {SOCKET_UNIT: socket_unit, SERVICE_UNIT: service_unit}


def _systemctl(*args: str) -> None:
    import subprocess

    done = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NotRunError(f"systemctl {' '.join(args)} failed: "
                          f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['?']}")


def install(group: str, size: int, slice_unit: str, say: Callable[[str], None]) -> None:
    """Write the units, enable and start the socket. Refuses (78) unless root on systemd, with a
    group that exists, a size the machine has, and code only root can change."""
    import grp

    from dispatch.capping.systemd import _pid1_is_systemd, _valid_slice_unit
    from dispatch.core.hostfacts import read_meminfo

    if os.geteuid() != 0:
        raise NotRunError("hostrun shared install: run it as root (it writes system units)")
    if not _pid1_is_systemd():
        raise NotRunError("hostrun shared install: needs systemd as PID 1 (a shared slice is a "
                          "system slice unit)")
    try:
        grp.getgrnam(group)
    except KeyError:
        raise UsageError(f"--group {group}: no such group (create it: groupadd {group})") from None
    if not _valid_slice_unit(slice_unit):
        raise UsageError(f"--slice {slice_unit}: must name a slice unit, e.g. hostrun.slice")
    total = read_meminfo().total
    if not 0 < size < total:
        raise UsageError(f"--size {format_size(size)}: must be more than 0 and less than the "
                         f"machine's {format_size(total)}")
    python = os.path.realpath(sys.executable)
    for path in (python, os.path.join(_package_root(), "dispatch")):
        problem = root_only(path)
        if problem is not None:
            raise NotRunError(f"hostrun shared install: the daemon would run {path} as root, but "
                              f"{problem}; install hostrun where only root can write (e.g. as root "
                              "with pipx)")
    for name, text in unit_texts(python, _package_root(), group, size, slice_unit).items():
        path = os.path.join(UNIT_DIR, name)
        tmp = f"{path}.hostrun-tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    _systemctl("daemon-reload")
    _systemctl("enable", "--now", SOCKET_UNIT)
    say(f"shared slice {slice_unit} of {format_size(size)} for group {group}: {SOCKET_PATH} "
        f"(members must log in again to be in the group; a running daemon keeps its old size until "
        f"'systemctl restart {SERVICE_UNIT}'; the jobs running then go on, booked)")


def _installed_slice() -> str | None:
    """The slice unit the installed service keeps (its ``--slice``), if any."""
    from dispatch.capping.systemd import _valid_slice_unit

    try:
        with open(os.path.join(UNIT_DIR, SERVICE_UNIT), encoding="utf-8", errors="replace") as fh:
            words = fh.read(1 << 16).split()
    except OSError:
        return None
    for flag, value in zip(words, words[1:]):
        if flag == "--slice" and _valid_slice_unit(value):
            return value
    return None


def uninstall(say: Callable[[str], None]) -> None:
    """Stop the engine and the slice (its jobs are killed: nothing runs unbooked), remove the
    units. The engine's ledger (``/var/lib/hostrun-shared``) is kept: peaks and history."""
    if os.geteuid() != 0:
        raise NotRunError("hostrun shared uninstall: run it as root")
    present = [n for n in (SOCKET_UNIT, SERVICE_UNIT) if os.path.exists(os.path.join(UNIT_DIR, n))]
    slice_unit = _installed_slice()
    if present:
        _systemctl("disable", "--now", *present)
    if slice_unit is not None:
        _systemctl("stop", slice_unit)  # the scopes in it: their engine is gone
    removed = []
    for name in (SOCKET_UNIT, SERVICE_UNIT):
        try:
            os.unlink(os.path.join(UNIT_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    _systemctl("daemon-reload")
    try:
        os.rmdir(SOCKET_DIR)
    except OSError:
        pass
    say(f"removed {', '.join(removed) or 'nothing (not installed)'}")
