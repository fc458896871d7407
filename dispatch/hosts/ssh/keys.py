"""The ``ssh`` kind's settings, declared once: its keys with their type tags (``KEYS``, from which
the pydantic model, the plain parser and its checks are derived) and, beside them, the typed record
the kind's code reads (``SshOptions``). Kept apart from ``dispatch.hosts.ssh.kind`` so that the transport,
the agent client and the peer driver can read it without importing the kind's ``Host``."""

from __future__ import annotations

from dispatch.core.hostkeys import INT, MEMORY_SIZE, PATH, TEXT, Key, KindSpec
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Optional

    from dispatch.core.settings import HostSettings

SSH = "ssh"

KEYS = (
    Key("ssh", "ssh", TEXT, required="a peer needs ssh = 'destination'"),
    Key("port", "port", INT, 1, 65535),
    Key("ssh_config", "ssh_config", PATH),
    Key("identity_file", "identity_file", PATH),
    Key("work_root", "work_root", TEXT),  # a path on the peer: nothing here to expand or check
    Key("python", "python", TEXT),
    Key("peer_memory_cap", "peer_memory_cap", MEMORY_SIZE, env="PEER_MEMORY_CAP"),
)


class SshOptions(NamedTuple):
    """An ssh host's own keys (one field per entry of ``KEYS``, same name)."""

    ssh: Optional[str] = None  # the destination, as the ssh command takes it
    port: Optional[int] = None
    ssh_config: Optional[str] = None
    identity_file: Optional[str] = None
    work_root: Optional[str] = None  # on the peer; default ~/hostrun-work
    python: Optional[str] = None  # on the peer; default python3
    peer_memory_cap: Optional[int] = None  # the largest cap a job may have there (249)


def options_of(host: HostSettings) -> SshOptions:
    return SshOptions(**{field: host.options.get(field) for field in SshOptions._fields})


SPEC = KindSpec(
    SSH, KEYS,
    refused=(("max_runtime", "max_runtime of a peer is set in the peer's own config ([hosts.local] "
                             "there); --max-runtime goes along with the job"),),
)
