"""Where the config file is, and settings from its already-parsed TOML mapping (standard library only).

pydantic (``dispatch.config.model``) validates a user's file strictly and then builds the settings
here; the remote agent on a bare peer, which has no pydantic, builds the peer's own settings here
directly (keys it does not know are ignored there: the peer's own hostrun validates its file).
"""

from __future__ import annotations

import os

from dispatch.core.errors import ConfigError
from dispatch.core.settings import LOCAL, HostSettings, Settings, cgroup_path_problem
from dispatch.core.units import parse_duration, parse_size

MYPY = False
if MYPY:
    from collections.abc import Mapping
    from typing import Any

_HOST_SIZES = {"slice": "slice_bytes", "reserve": "reserve_bytes", "default_cap": "default_cap",
               "gamble_size": "gamble_size", "peer_memory_cap": "peer_memory_cap"}
_HOST_PLAIN = ("heavy_threads", "cgroup", "backend", "ssh", "port", "ssh_config", "identity_file",
               "work_root", "python")
_TOP_DURATIONS = ("long_job_threshold", "pending_window", "report_timeout", "report_deadline",
                  "status_interval", "kill_grace", "control_persist", "alert_wait_after")


def _expand(path: Any) -> Any:
    return os.path.expanduser(path) if isinstance(path, str) else path


def host_from_dict(name: str, table: Mapping[str, Any], source: str = "") -> HostSettings:
    """One host's settings. ``cgroup`` is checked here, on both paths (pydantic's and the agent's)."""
    values: dict[str, Any] = {"name": name}
    if table.get("cgroup") is not None:
        problem = cgroup_path_problem(table["cgroup"])
        if problem is not None:
            raise ConfigError(f"{source + ': ' if source else ''}hosts.{name}.cgroup: {problem}")
    for key, field in _HOST_SIZES.items():
        if table.get(key) is not None:
            values[field] = parse_size(table[key])
    if table.get("max_runtime") is not None:
        values["max_runtime"] = parse_duration(table["max_runtime"])
    for key in _HOST_PLAIN:
        if table.get(key) is not None:
            values[key] = table[key]
    for key in ("ssh_config", "identity_file"):
        if key in values:
            values[key] = _expand(values[key])
    if "cgroup" in values:
        values["cgroup"] = values["cgroup"].rstrip("/")
    return HostSettings(**values)


def settings_from_dict(raw: Mapping[str, Any], source: str) -> Settings:
    """Build Settings from a TOML mapping. A ``state_dir`` left unset stays "" so that it is
    resolved from the environment on every load (see ``Settings.with_env_overrides``)."""
    values: dict[str, Any] = {}
    for key in _TOP_DURATIONS:
        if raw.get(key) is not None:
            values[key] = parse_duration(raw[key])
    if raw.get("gamble_size") is not None:
        values["gamble_size"] = parse_size(raw["gamble_size"])
    if raw.get("groups"):
        values["groups"] = {name: int(table["max_running"]) for name, table in raw["groups"].items()
                            if (table or {}).get("max_running") is not None}
    for key in ("toolchain_probes", "sync_excludes"):
        if raw.get(key) is not None:
            values[key] = tuple(str(item) for item in raw[key])
    if raw.get("clear_mark_after") is not None:
        values["clear_mark_after"] = max(1, int(raw["clear_mark_after"]))
    if raw.get("history_days") is not None:
        values["history_days"] = float(raw["history_days"])
    if raw.get("history_rows") is not None:
        values["history_rows"] = int(raw["history_rows"])
    if raw.get("enable_across_machines") is not None:
        values["enable_across_machines"] = bool(raw["enable_across_machines"])
    hosts = {name: host_from_dict(name, table or {}, source)
             for name, table in (raw.get("hosts") or {}).items()}
    hosts.setdefault(LOCAL, HostSettings(LOCAL))
    return Settings.default(
        state_dir=_expand(raw.get("state_dir")) or "",
        alert_file=_expand(raw.get("alert_file")) or None,
        hosts=hosts,
        source=os.path.abspath(source),
        **values,
    )


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
