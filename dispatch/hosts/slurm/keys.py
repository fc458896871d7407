"""The ``slurm`` kind's settings, declared once (docs/slurm.md, "Configuration").

A Slurm cluster is reached in one of two ways: its client commands (``srun``, ``scontrol``, ...) run
on this machine and the tree is on a filesystem the nodes share (no ``ssh`` key), or they run on a
login node reached over SSH with the same transport as a peer (``ssh`` and its companions), the tree
rsynced to ``work_root`` there. Slurm itself caps and places the job, so the keys of hostrun's own
runner on a host (slice, reserve, cgroup, backend, gamble size) are refused here.
"""

from __future__ import annotations

from dispatch.core.hostkeys import INT, PATH, TEXT, WORDS, Key, KindSpec
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.settings import HostSettings

SLURM = "slurm"

KEYS = (
    Key("partition", "partition", TEXT),
    Key("account", "account", TEXT),
    Key("qos", "qos", TEXT),
    Key("srun_args", "srun_args", WORDS),  # e.g. ["--constraint=a100"], after hostrun's own flags
    Key("slurm_conf", "slurm_conf", TEXT),  # SLURM_CONF for the client commands (where they run)
    # A login node: as for an ssh peer (dispatch.hosts.ssh.keys), so the SSH transport reads them.
    Key("ssh", "ssh", TEXT),
    Key("port", "port", INT, 1, 65535),
    Key("ssh_config", "ssh_config", PATH),
    Key("identity_file", "identity_file", PATH),
    Key("work_root", "work_root", TEXT),
    Key("python", "python", TEXT),
)


class SlurmOptions(NamedTuple):
    """A slurm host's own keys (one field per entry of ``KEYS``, same name)."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    srun_args: tuple[str, ...] = ()
    slurm_conf: Optional[str] = None
    ssh: Optional[str] = None  # a login node; None: Slurm's client commands run here
    port: Optional[int] = None
    ssh_config: Optional[str] = None
    identity_file: Optional[str] = None
    work_root: Optional[str] = None  # on the login node; default ~/hostrun-work
    python: Optional[str] = None  # on the login node; default python3


def options_of(host: HostSettings) -> SlurmOptions:
    values: dict[str, Any] = {field: host.options.get(field) for field in SlurmOptions._fields}
    values["srun_args"] = tuple(values["srun_args"] or ())
    return SlurmOptions(**values)


_CAPPED_BY_SLURM = ("Slurm caps and places jobs on a cluster ({key} is for hostrun's own runner on a "
                    "machine): size jobs with -m or default_cap, which become srun --mem")
SPEC = KindSpec(
    SLURM, KEYS,
    refused=tuple((key, _CAPPED_BY_SLURM.format(key=key))
                  for key in ("slice", "reserve", "cgroup", "backend", "gamble_size")),
)
