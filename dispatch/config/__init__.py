"""Find, validate and cache the configuration.

Search order: ``--config PATH``, then ``$HOSTRUN_CONFIG``, then ``./hosts.toml``, then
``$XDG_CONFIG_HOME/hostrun/hosts.toml`` (``~/.config/hostrun/hosts.toml``); with none, the embedded
default (this host only) serves.

pydantic costs ~150 ms to import, so it stays off the hot path of ``hostrun -- CMD``: a file is
validated once, and its normalized form is cached (``marshal``: no ``json``/``re`` import on the hot
path) keyed by the file's path, size, mtime and inode; later runs read that while the file is
unchanged. The cache is private to its owner, like every state file.
"""

from __future__ import annotations

import marshal
import os
import sys
from collections.abc import Mapping

from dispatch import __version__
from dispatch.errors import ConfigError
from dispatch.fingerprint import short_hash
from dispatch.settings import Settings

CACHE_FORMAT = 2


def find_config(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """The config file to use, or None for the embedded default. An explicit path must exist."""
    if explicit:
        if not os.path.isfile(explicit):
            raise ConfigError(f"config file not found: {explicit}")
        return explicit
    env_path = environ.get("HOSTRUN_CONFIG")
    if env_path:
        if not os.path.isfile(env_path):
            raise ConfigError(f"HOSTRUN_CONFIG names a missing file: {env_path}")
        return env_path
    home = environ.get("HOME") or os.path.expanduser("~")
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for candidate in ("hosts.toml", os.path.join(config_home, "hostrun", "hosts.toml")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _cache_dir(environ: Mapping[str, str]) -> str:
    home = environ.get("HOME") or os.path.expanduser("~")
    base = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return os.path.join(base, "hostrun", "config")


def _cache_key(path: str) -> list[object]:
    st = os.stat(path)
    return [CACHE_FORMAT, __version__, sys.hexversion, os.path.realpath(path), st.st_size, st.st_mtime_ns,
            st.st_ino]


def load_settings(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in force, with environment overrides applied."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    path = find_config(explicit, env)
    if path is None:
        return Settings.default().with_env_overrides(env)
    return _load_file(path, env).with_env_overrides(env)


def _load_file(path: str, environ: Mapping[str, str]) -> Settings:
    key = _cache_key(path)
    cache_file = os.path.join(
        _cache_dir(environ), short_hash(str(key[3]).encode(), 32) + ".marshal"
    )
    try:
        with open(cache_file, "rb") as fh:
            cached = marshal.load(fh)
        if cached.get("key") == key:
            return Settings.from_normalized(cached["settings"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, AttributeError):
        pass
    from dispatch.config.model import validate_file  # pydantic: only on a cache miss

    settings = validate_file(path)
    _write_cache(cache_file, {"key": key, "settings": settings.to_normalized()})
    return settings


def _write_cache(cache_file: str, payload: dict[str, object]) -> None:
    """Best effort: a cache that cannot be written only costs the next run a validation."""
    directory = os.path.dirname(cache_file)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = f"{cache_file}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            marshal.dump(payload, fh)
        os.replace(tmp, cache_file)
    except OSError:
        pass
