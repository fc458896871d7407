"""Whether this user belongs to a shared slice an administrator installed here, told apart from
whether its daemon answers now.

The socket alone cannot say: it is gone when the socket unit is stopped or hit its start limit, and
a stalled daemon still accepts connections. So the mark is the installed socket unit
(``/etc/systemd/system/hostrun-shared.socket``, written by ``hostrun shared install``), trusted
only when it and every directory above it are root's alone (else any user could fake or hide it),
and its ``SocketGroup=``: a user in that group is a member, whose runs must stay in the shared
budget. Standard library only.
"""

from __future__ import annotations

import os

UNIT_PATH = "/etc/systemd/system/hostrun-shared.socket"  # sharedinstall.UNIT_DIR + SOCKET_UNIT
START_AGAIN = ("systemctl reset-failed hostrun-shared.socket hostrun-shared.service; "
               "systemctl restart hostrun-shared.socket")


def installed_group(path: str | None = None) -> str | None:
    """The group of the installed shared slice (None: none installed, or its unit is not root's
    alone and so proves nothing)."""
    from dispatch.capping.shared import root_only

    path = path or UNIT_PATH
    if not os.path.exists(path) or root_only(path) is not None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SocketGroup" and value.strip():
            return value.strip()
    return None


def is_member(group: str) -> bool:
    """This process holds ``group``, or the group database lists this user in it (added, but not
    logged in again since: still a member the administrator meant to share the budget)."""
    import grp
    import pwd

    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return False
    if entry.gr_gid in os.getgroups() or entry.gr_gid == os.getegid():
        return True
    try:
        name = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return False
    return name in entry.gr_mem


def member_group(path: str | None = None) -> str | None:
    """The installed shared slice's group when this user is a member of it, else None."""
    group = installed_group(path)
    return group if group is not None and is_member(group) else None


def refusal(group: str, why: str) -> str:
    """The one line a member's run ends with (78) when the shared slice does not answer."""
    return (f"the shared slice of group {group} is installed here but not usable: "
            f"{why}; nothing ran outside it. An administrator runs '{START_AGAIN}'; to run in your "
            "own slice instead, set backend = \"systemd\" under [hosts.local]")


def outside_note(group: str, backend: str) -> str:
    """The line a member's run prints when its configuration chose to run outside the slice."""
    return (f"hostrun: running outside the shared slice of group {group} (backend = {backend!r} in "
            "[hosts.local]): this job's memory is not in the group's budget")
