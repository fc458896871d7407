"""The registry of host kinds: the ``kind`` key's values and the ``Host`` class of each.

``local`` is built in; every other kind is a package of its own under ``dispatch/hosts/`` whose
``kind`` module names its class as ``HOST`` (``ssh/kind.py``, ``slurm/kind.py``). Adding a kind is
adding its package: nothing outside it names the kind. Everything else asks the ``Host``
(``dispatch.hosts.base``) and reads the kind's ``spec``.
"""

from __future__ import annotations

import os
import sys

from dispatch.hosts.base import Host
from dispatch.hosts.local import LocalHost

MYPY = False
if MYPY:
    from dispatch.core.hostkeys import KindSpec
    from dispatch.core.settings import Settings


def _packaged() -> list[type[Host]]:
    """Each kind package's ``HOST``, by package name (``__import__``: the ``importlib`` package
    would load ``warnings`` on every run's path)."""
    here = os.path.dirname(os.path.abspath(__file__))
    found: list[type[Host]] = []
    for name in sorted(os.listdir(here)):
        if os.path.isfile(os.path.join(here, name, "kind.py")):
            module = f"dispatch.hosts.{name}.kind"
            __import__(module)
            found.append(sys.modules[module].HOST)
    return found


_ALL: list[type[Host]] = [LocalHost, *_packaged()]
KINDS: dict[str, type[Host]] = {kind.kind: kind for kind in _ALL}


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
