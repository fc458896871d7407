"""Find, validate and cache the configuration.

Search order: ``--config PATH``, then ``$HOSTRUN_CONFIG``, then ``./hosts.toml``, then
``$XDG_CONFIG_HOME/hostrun/hosts.toml`` (``~/.config/hostrun/hosts.toml``); with none, the embedded
default (this host only) serves.

pydantic costs ~150 ms to import, so it stays off the hot path of ``hostrun -- CMD``: a file is
validated once, and its normalized form is cached (``marshal``: no ``json``/``re`` import on the hot
path) keyed by the file's path, size, mtime and inode; later runs read that while the file is
unchanged. The cache is private to its owner, like every state file, and is read back only when it
and its directory are (a foreign or others-writable cache is ignored and never overwritten). After a
config edit, a burst of concurrent runs validates once: the first takes an flock on the cache
directory's ``lock`` file, the others wait there and then read its entry.

Trust (``dispatch.guards.trust``, docs/trust.md): the config file, the ``ssh_config``/``identity_file`` it
names and the state directory must be the invoking user's or root's and writable by nobody else.
"""

from __future__ import annotations

import marshal
import os
import sys

from dispatch import __version__
from dispatch.core.configpath import cache_dir, find_config
from dispatch.core.errors import ConfigError
from dispatch.core.fingerprint import short_hash
from dispatch.core.settings import Settings
from dispatch.guards import trust

MYPY = False
if MYPY:
    from collections.abc import Mapping

CACHE_FORMAT = 4


def _cache_dir(environ: Mapping[str, str]) -> str:
    return cache_dir(environ, "config")


def _cache_key(path: str, st: os.stat_result | None = None) -> list[object]:
    st = os.stat(path) if st is None else st
    return [CACHE_FORMAT, __version__, sys.hexversion, os.path.realpath(path), st.st_size, st.st_mtime_ns,
            st.st_ino]


def load_settings(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in force, with environment overrides applied. Every file they come from or name
    must be trusted (``dispatch.guards.trust``): another user's config could run commands as us."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    path = find_config(explicit, env)
    if path is None:
        settings = Settings.default().with_env_overrides(env)
        trust.check_existing_dir(settings.state_dir, "state directory")
        _check_alert_file(settings, "alert_file", env)
        return settings
    settings = _load_file(path, env).with_env_overrides(env)
    _check_named(settings, path, env)
    return settings


def _check_named(settings: Settings, path: str, environ: Mapping[str, str]) -> None:
    """The files a trusted config names are checked on every load (the cache cannot vouch for them):
    a few ``lstat`` calls. A file not there yet is judged by the directories it would be in (someone
    else able to create it there could hand ssh their file); ssh complains that it is missing."""
    for host in settings.hosts.values():
        for key in host.files:  # e.g. an ssh host's ssh_config, identity_file
            named = host.options.get(key)
            if not named:
                continue
            try:
                trust.check_file(named, f"hosts.{host.name}.{key} (in {os.path.abspath(path)})", environ)
            except OSError:  # unreadable on the way (permission denied): ssh will say so
                continue
    trust.check_existing_dir(settings.state_dir, f"state_dir (from {os.path.abspath(path)})")
    _check_alert_file(settings, f"alert_file (from {os.path.abspath(path)})", environ)


def _check_alert_file(settings: Settings, what: str, environ: Mapping[str, str]) -> None:
    """A configured ``alert_file`` is judged as a config file is (``trust.check_file``): alerts are
    read back as instructions to sessions (the watchdog hands them on), and the file is appended to
    as the caller, root included, so another user's file, or one in a directory they can write,
    would let them forge alerts or have root append to a file they chose. The default, in the
    state directory, is covered by that directory's own check."""
    if settings.alert_file:
        try:
            trust.check_file(settings.alert_file, what, environ)
        except OSError:  # unreadable on the way (permission denied): writing it will say so
            pass


def _load_file(path: str, environ: Mapping[str, str]) -> Settings:
    st = os.stat(path)
    trust.check_file(path, "config file", environ, st)
    key = _cache_key(path, st)
    directory = _cache_dir(environ)
    cache_file = os.path.join(directory, short_hash(str(key[3]).encode(), 32) + ".marshal")
    cached = _read_cache(directory, cache_file, key)
    if cached is not None:
        return cached
    return _validate_once(path, environ, directory, cache_file)


def _read_cache(directory: str, cache_file: str, key: list[object]) -> Settings | None:
    """The cached settings if the entry matches ``key`` and only we could have written it (a foreign
    or others-writable cache, e.g. under another user's $XDG_CACHE_HOME, is ignored)."""
    try:
        if not trust.private_dir_ok(directory):
            return None
        fd = os.open(cache_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not trust.own_file_ok(os.fstat(fd)):
                return None
            cached = marshal.load(fh)
        if cached.get("key") == key:
            return Settings.from_normalized(cached["settings"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, AttributeError):
        pass
    return None


def _validate_once(path: str, environ: Mapping[str, str], directory: str, cache_file: str) -> Settings:
    """Validate the file (pydantic) and cache the result, once for a burst of concurrent runs: under
    an flock on the cache directory's lock file, the first validates and writes, the others then
    find its entry. Without a usable (private) cache directory, validate and cache nothing."""
    lock_fd = None
    try:
        trust.private_dir(directory)
        lock_fd = os.open(os.path.join(directory, "lock"),
                          os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        from dispatch.core.flocking import flock_wait

        flock_wait(lock_fd)
    except (OSError, ConfigError):
        if lock_fd is not None:
            os.close(lock_fd)
        lock_fd = None
    try:
        with open(path, "rb") as fh:  # what is validated is exactly what was checked and keyed
            st = os.fstat(fh.fileno())
            trust.check_file(path, "config file", environ, st)
            key = _cache_key(path, st)
            if lock_fd is not None:
                cached = _read_cache(directory, cache_file, key)
                if cached is not None:
                    return cached
            data = fh.read()
        from dispatch.config.model import validate_file  # pydantic: only on a cache miss

        settings = validate_file(path, data)
        if lock_fd is not None:
            _write_cache(cache_file, {"key": key, "settings": settings.to_normalized()})
        return settings
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _write_cache(cache_file: str, payload: dict[str, object]) -> None:
    """Best effort, into the private directory checked by the caller: a cache that cannot be written
    only costs the next run a validation."""
    from dispatch.core.atomicfile import write_atomic

    try:
        write_atomic(cache_file, marshal.dumps(payload))
    except OSError:
        pass
