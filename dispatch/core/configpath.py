"""Where the config file is (standard library only; on the path of every ``hostrun`` call, so it
imports nothing of the key tables or the parser: ``dispatch.core.configfile``).

Search order: ``--config PATH``, then ``$HOSTRUN_CONFIG``, then ``./hosts.toml``, then
``$XDG_CONFIG_HOME/hostrun/hosts.toml`` (``~/.config/hostrun/hosts.toml``); with none, the embedded
default (this host only) serves.
"""

from __future__ import annotations

import os

MYPY = False
if MYPY:
    from collections.abc import Mapping


def user_home(environ: Mapping[str, str] | None = None) -> str:
    """``$HOME``, else the password database's home (``~``): the one rule for every per-user path."""
    env = os.environ if environ is None else environ
    return env.get("HOME") or os.path.expanduser("~")


def find_config(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """The config file to use, or None for the embedded default. An explicit path must exist."""
    from dispatch.core.errors import ConfigError  # failure paths only (errors load exitcodes: enum)

    if explicit:
        if not os.path.isfile(explicit):
            raise ConfigError(f"config file not found: {explicit}")
        return explicit
    env_path = environ.get("HOSTRUN_CONFIG")
    if env_path:
        if not os.path.isfile(env_path):
            raise ConfigError(f"HOSTRUN_CONFIG names a missing file: {env_path}")
        return env_path
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(user_home(environ), ".config")
    for candidate in ("hosts.toml", os.path.join(config_home, "hostrun", "hosts.toml")):
        if os.path.isfile(candidate):
            return candidate
    return None


def cache_dir(environ: Mapping[str, str], *parts: str) -> str:
    """``$XDG_CACHE_HOME/hostrun[/<parts>]`` (``~/.cache/hostrun``): hostrun's per-user caches."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(user_home(environ), ".cache")
    return os.path.join(base, "hostrun", *parts)
