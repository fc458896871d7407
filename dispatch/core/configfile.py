"""Settings from a config file's already-parsed TOML mapping (standard library only; where the file is:
``dispatch.core.configpath``).

pydantic (``dispatch.config.model``) validates a user's file strictly and then builds the settings
here; the remote agent on a bare peer, which has no pydantic, builds the peer's own settings here
directly (keys it does not know are ignored there: the peer's own hostrun validates its file).
"""

from __future__ import annotations

import os

from dispatch.core.errors import ConfigError
from dispatch.core.hostkeys import (
    BOOL,
    CGROUP,
    COMMON,
    COUNT,
    DURATION,
    INT,
    LOCAL,
    LOCAL_KIND,
    MEMORY_SIZE,
    PATH,
    POSITIVE_DURATION,
    POSITIVE_NUMBER,
    QUEUE_POLICY,
    SIZE,
    TOP,
    WORDS,
    inferred_kind,
    kind_problem,
)
from dispatch.core.settings import (
    QUEUE_POLICIES,
    AgentSettings,
    HostSettings,
    SessionSettings,
    Settings,
    cgroup_path_problem,
)
from dispatch.core.units import parse_duration, parse_size

MYPY = False
if MYPY:
    from collections.abc import Mapping
    from typing import Any

    from dispatch.core.hostkeys import Key, KindSpec

# What the agent on a peer knows: hostrun's own runner there, i.e. this machine (``local``).
AGENT_KINDS: dict[str, KindSpec] = {LOCAL: LOCAL_KIND}


def _expand(path: Any) -> Any:
    return os.path.expanduser(path) if isinstance(path, str) else path


def _value(key: Key, value: Any, where: str) -> Any:
    """A value as its key's type tag says (already validated by pydantic on the controller; the
    agent's path has no pydantic, so what would break a run is checked here too)."""
    if key.type in (SIZE, MEMORY_SIZE):
        return parse_size(value)
    if key.type in (DURATION, POSITIVE_DURATION):
        return parse_duration(value)
    if key.type == BOOL:
        return bool(value)
    if key.type in (INT, COUNT):
        return int(value) if key.low is None else max(key.low, int(value))
    if key.type == POSITIVE_NUMBER:
        return float(value)
    if key.type == QUEUE_POLICY:
        problem = queue_policy_problem(value)
        if problem is not None:
            raise ConfigError(f"{where}: {key.key}: {problem}")
        return value
    if key.type == PATH:
        return _expand(value)
    if key.type == WORDS:
        return tuple(str(word) for word in value)
    if key.type == CGROUP:  # checked here, on both paths (pydantic's and the agent's)
        problem = cgroup_path_problem(value)
        if problem is not None:
            raise ConfigError(f"{where}.{key.key}: {problem}")
        return value.rstrip("/")
    return value


def queue_policy_problem(value: Any) -> str | None:
    """Why a ``queue_policy`` value is refused, or None (both parsers use this one check)."""
    if value not in QUEUE_POLICIES:
        return f"must be one of {', '.join(QUEUE_POLICIES)}, not {value!r}"
    return None


def host_kind(name: str, table: Mapping[str, Any], source: str = "") -> str:
    """The table's ``kind`` (else the one its name implies); a kind that cannot go with the name
    (``hostkeys.kind_problem``) is a ConfigError."""
    kind = table.get("kind")
    kind = inferred_kind(name) if kind is None else str(kind)
    problem = kind_problem(name, kind)
    if problem is not None:
        raise ConfigError(f"{source + ': ' if source else ''}hosts.{name}.kind: {problem}")
    return kind


def host_from_dict(name: str, table: Mapping[str, Any], source: str = "",
                   spec: KindSpec = LOCAL_KIND) -> HostSettings:
    """One host's settings: the shared keys (``COMMON``) as fields, ``spec``'s own in ``options``.
    Keys of neither are ignored (the agent's case: the peer's own hostrun validates its file)."""
    where = f"{source + ': ' if source else ''}hosts.{name}"
    values: dict[str, Any] = {"name": name, "kind": spec.name}
    for key in COMMON:
        if table.get(key.key) is not None:
            values[key.field] = _value(key, table[key.key], where)
    options = {key.field: _value(key, table[key.key], where) for key in spec.keys
               if table.get(key.key) is not None}
    if options:
        values["options"] = options
        values["files"] = tuple(key.field for key in spec.keys if key.type == PATH and key.field in options)
    return HostSettings(**values)


def agents_from_dict(table: Mapping[str, Any]) -> AgentSettings:
    """The ``[agents]`` table (validated by ``dispatch.config.model.AgentsModel`` first)."""
    values: dict[str, Any] = {}
    for key in ("mode", "escape_env", "subagent_suite"):
        if table.get(key) is not None:
            values[key] = str(table[key])
    for key in ("heavy", "light", "gpu"):
        if table.get(key) is not None:
            values[key] = tuple(str(item) for item in table[key])
    if table.get("escape_min") is not None:
        values["escape_min"] = int(table["escape_min"])
    return AgentSettings(**values)


def sessions_from_dict(table: Mapping[str, Any]) -> SessionSettings:
    """The ``[sessions]`` table (validated by ``dispatch.config.model.SessionsModel`` first)."""
    values: dict[str, Any] = {}
    for key in ("share", "high"):
        if table.get(key) is not None:
            values[key] = float(table[key])
    for key in ("cap", "first_booking"):
        if table.get(key) is not None:
            values[key] = parse_size(table[key])
    if table.get("place") is not None:
        values["place"] = bool(table["place"])
    return SessionSettings(**values)


def settings_from_dict(raw: Mapping[str, Any], source: str,
                       kinds: Mapping[str, KindSpec] = AGENT_KINDS) -> Settings:
    """Build Settings from a TOML mapping, knowing the host ``kinds`` (the controller passes every
    registered kind, ``dispatch.hosts.kinds``; the agent only ``local``): a host of another kind is
    left out. A ``state_dir`` left unset stays "" so that it is resolved from the environment on
    every load (see ``Settings.with_env_overrides``)."""
    values: dict[str, Any] = {key.field: _value(key, raw[key.key], source) for key in TOP
                              if raw.get(key.key) is not None}
    if raw.get("groups"):
        values["groups"] = {name: int(table["max_running"]) for name, table in raw["groups"].items()
                            if (table or {}).get("max_running") is not None}
        values["requeue_groups"] = tuple(name for name, table in raw["groups"].items()
                                         if (table or {}).get("requeue"))
    if raw.get("toolchain_programs"):
        values["toolchain_programs"] = {str(name): tuple(str(p) for p in probes)
                                        for name, probes in raw["toolchain_programs"].items()}
    if raw.get("agents") is not None:
        values["agents"] = agents_from_dict(raw["agents"])
    if raw.get("sessions") is not None:
        values["sessions"] = sessions_from_dict(raw["sessions"])
    hosts = {}
    for name, table in (raw.get("hosts") or {}).items():
        kind = host_kind(name, table or {}, source)
        if kind in kinds:
            hosts[name] = host_from_dict(name, table or {}, source, kinds[kind])
    hosts.setdefault(LOCAL, HostSettings(LOCAL, LOCAL))
    overrides = {key.env: (spec.name, key.field) for spec in kinds.values() for key in spec.keys
                 if key.env}
    values["state_dir"] = values.get("state_dir") or ""  # "": resolved from the environment per load
    values["alert_file"] = values.get("alert_file") or None
    return Settings.default(
        hosts=hosts,
        source=os.path.abspath(source),
        overrides=overrides,
        **values,
    )


def make_host(name: str, spec: KindSpec = LOCAL_KIND, **values: Any) -> HostSettings:
    """A host's settings from already-parsed values by field name: the shared keys become fields,
    ``spec``'s own keys its ``options`` (for code and tests that build settings by hand)."""
    own = {key.field for key in spec.keys}
    options = {field: value for field, value in values.items() if field in own}
    common = {field: value for field, value in values.items() if field not in own}
    files = tuple(key.field for key in spec.keys if key.type == PATH and key.field in options)
    return HostSettings(name, spec.name, options=options, files=files, **common)
