"""The registry of host kinds: the ``kind`` key's values and the ``Host`` class of each.

Adding a kind is one entry in ``KINDS`` (its class, from its own module); everything else asks the
``Host`` (``dispatch.hosts.base``) and reads the kind's ``spec``.
"""

from __future__ import annotations

from dispatch.hosts.base import Host
from dispatch.hosts.local import LocalHost
from dispatch.hosts.slurm import SlurmHost
from dispatch.hosts.ssh import SshPeer

MYPY = False
if MYPY:
    from dispatch.core.hostkeys import KindSpec
    from dispatch.core.settings import Settings

KINDS: dict[str, type[Host]] = {kind.kind: kind for kind in (LocalHost, SshPeer, SlurmHost)}


def specs() -> dict[str, KindSpec]:
    """Every registered kind's settings declaration, by kind name."""
    return {name: kind.spec for name, kind in KINDS.items()}


def host_for(config: Settings, name: str) -> Host:
    """The configured host ``name`` as its kind's ``Host`` (KeyError: no such host)."""
    settings = config.hosts[name]
    return KINDS[settings.kind_name](config, settings)


def hosts_of(config: Settings, names: list[str] | None = None) -> list[Host]:
    """``names`` (default: every configured host, in the configured order) as ``Host``s."""
    return [host_for(config, name) for name in (list(config.hosts) if names is None else names)]


def here(config: Settings) -> Host:
    """This machine (the ``local`` host)."""
    return next(h for h in hosts_of(config) if h.is_here)
