"""The normalized, validated configuration as plain records (standard library only).

``dispatch.config`` builds these from TOML (validated by pydantic, cached with ``marshal``) or from the
embedded default; everything else reads only these. Sizes are bytes, durations seconds. NamedTuples
rather than dataclasses: dataclasses compile their methods with ``exec`` at import time, which costs
``hostrun -- CMD`` milliseconds on every call.
"""

from __future__ import annotations

import os

from dispatch.core.records import NamedTuple
from dispatch.core.units import MIN_SIZE, GiB

MYPY = False
if MYPY:
    from collections.abc import Mapping
    from typing import Any, Optional

# Kept here, not with the key tables (``dispatch.core.hostkeys``): every ``hostrun -- CMD`` needs them,
# and only a config being parsed needs the tables.
LOCAL = "local"
DEFAULT_PEER_KIND = "ssh"  # a [hosts.NAME] table without ``kind`` other than ``local``, as always


def inferred_kind(name: str) -> str:
    """The kind of a table without ``kind``: ``local`` is this machine, any other name an SSH peer."""
    return LOCAL if name == LOCAL else DEFAULT_PEER_KIND


# Below this the default reserve leaves no slice worth having: say so (78) instead of a 0 B slice in
# which every job "could never be admitted" (243).
MIN_DEFAULT_SLICE = 256 << 20


def default_state_dir(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    from dispatch.core.configpath import user_home

    return os.path.join(env.get("XDG_STATE_HOME") or os.path.join(user_home(env), ".local", "state"),
                        "hostrun")


class HostSettings(NamedTuple):
    """One ``[hosts.NAME]`` table. ``None`` means "derive from the machine" (see the docs).

    The keys every kind shares (``dispatch.core.hostkeys.COMMON``) are fields; the kind's own keys
    are in ``options`` (a plain mapping, so the config cache can marshal it), from which the kind's
    module builds its typed record (e.g. ``dispatch.hosts.ssh.keys.SshOptions``). ``kind`` empty: the
    kind its name implies (``hostkeys.inferred_kind``); the parsers always set it.
    """

    name: str
    kind: str = ""
    slice_bytes: Optional[int] = None
    reserve_bytes: Optional[int] = None
    heavy_threads: Optional[int] = None
    default_cap: Optional[int] = None
    gamble_size: Optional[int] = None
    cgroup: Optional[str] = None
    backend: Optional[str] = None
    max_runtime: Optional[float] = None  # seconds; runs here without --max-runtime stop after it
    options: Mapping[str, Any] = {}  # the kind's own keys, by their name in its key table
    files: tuple[str, ...] = ()  # those of ``options`` that name a file here (trust-checked on load)

    @property
    def kind_name(self) -> str:
        """The host's kind: the one set, else the one its name implies."""
        return self.kind or inferred_kind(self.name)

    def slice_limit(self, mem_total: int, source: str = "", cap: int | None = None) -> int:
        """Slice size: ``slice`` if set, else RAM minus ``reserve`` (default 20% of RAM, >= 2 GiB).

        A ``reserve`` that leaves less than 1 MiB is a configuration error (exit 2): the config was
        checked against the RAM of the machine that validated it, which may not be this one. A
        default reserve that leaves less than ``MIN_DEFAULT_SLICE`` is a NoSliceError (78) naming the
        line to add, one that holds ``cap``, and the file: ``source`` (``Settings.source``), else the
        per-user one (``dispatch.core.sliceadvice.config_file``).
        """
        if self.slice_bytes is not None:
            return self.slice_bytes
        reserve = self.reserve_bytes
        if reserve is None:
            reserve = max(2 * GiB, mem_total // 5)  # sliceadvice.default_reserve (not imported here)
        if self.reserve_bytes is not None and mem_total - reserve < MIN_SIZE:
            from dispatch.core.errors import ConfigError
            from dispatch.core.units import format_size

            raise ConfigError(f"hosts.{self.name}.reserve {format_size(reserve)} leaves no slice: "
                              f"this machine has {format_size(mem_total)} of RAM")
        if self.reserve_bytes is None and mem_total - reserve < MIN_DEFAULT_SLICE:
            from dispatch.core.errors import NoSliceError
            from dispatch.core.sliceadvice import config_file, no_slice

            raise NoSliceError(no_slice(self.name, mem_total, config_file(source), cap))
        return max(0, mem_total - reserve)

    def threads(self) -> int:
        """``heavy_threads``, else the cores this process may run on (its CPU affinity)."""
        if self.heavy_threads:
            return self.heavy_threads
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return os.cpu_count() or 1


AGENT_MODES = ("remind", "wrap", "guard")
# ``queue_policy``: "backfill" lets a job with a recorded duration start ahead of a memory-blocked
# head when it cannot delay it (docs/admission.md, "Backfill"); "fifo" is strict arrival order.
QUEUE_POLICIES = ("backfill", "fifo")
ESCAPE_ENV = "HOSTRUN_DIRECT"


class AgentSettings(NamedTuple):
    """The ``[agents]`` table: how the coding-agent hooks treat a heavy shell command (docs/agents.md).

    ``mode``: ``remind`` (add the resource table, never refuse), ``wrap`` (rewrite it to run through
    hostrun) or ``guard`` (refuse it unless it runs through hostrun). ``heavy``/``light``/``gpu``: the
    project's patterns (``dispatch.hooks.rules``). ``escape_env``/``escape_min``: the variable that
    holds a person's scope declaration for a deliberate direct run through guard, and the length its
    reason must exceed. ``subagent_suite``: ``refuse`` (a subagent never runs the whole test suite,
    through hostrun or not) or ``allow``.
    """

    mode: str = "guard"
    heavy: tuple[str, ...] = ()
    light: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()
    escape_env: str = ESCAPE_ENV
    escape_min: int = 12
    subagent_suite: str = "refuse"


class SessionSettings(NamedTuple):
    """The ``[sessions]`` table: agent sessions run with ``hostrun session`` (docs/agents.md,
    "Sessions under the budget").

    ``share``: the part of hostrun's slice its sessions slice may hold (the rest stays for jobs);
    ``cap``: a session's cap when neither ``-m`` nor a recorded peak gives one (the half rule of the
    worst resumed session measured for the design, 1970 MiB: 4608 MiB); ``first_booking``: what a
    session with no recorded peak is booked at; ``high``: its high mark (``MemoryHigh``: reclaim and
    slow down before the kill), as a part of its cap; ``place``: the SessionStart hook places a
    session started without ``hostrun session`` into the sessions slice (``local.sessions.sessionplace``)."""

    share: float = 0.5
    cap: int = 4608 << 20
    first_booking: int = 2 << 30
    high: float = 0.9
    place: bool = False

    def limit(self, slice_limit: int) -> int:
        """The sessions slice's limit within a slice of ``slice_limit``, whole pages."""
        return int(slice_limit * self.share) // 4096 * 4096

    def high_mark(self, cap: int) -> int:
        """A session's high mark under its cap ``cap``, whole pages."""
        return int(cap * self.high) // 4096 * 4096


SESSION_LABEL_PREFIX = "session:"  # a session's label: ``session:NAME`` (its peaks apart from any job's)


class Settings(NamedTuple):
    state_dir: str
    hosts: Mapping[str, HostSettings]
    alert_file: Optional[str] = None
    long_job_threshold: float = 2 * 3600.0
    pending_window: float = 30.0
    report_timeout: float = 12.0
    report_deadline: float = 25.0
    enable_across_machines: bool = False
    gamble_size: int = 512 << 20
    default_gpu_memory: int = 2 << 30  # --gpu-memory auto for a label with no recorded VRAM peak
    status_interval: float = 60.0
    alert_wait_after: float = 600.0  # a job waiting this long raises one alert; 0: never
    kill_grace: float = 10.0
    control_persist: float = 600.0
    agent_idle: float = 600.0  # a peer's report daemon exits this long after its last request; 0: none
    # Probes compared for every --peer job, besides those of the programs it runs (guards/toolchain).
    toolchain_probes: tuple[str, ...] = ()
    # Program name -> its probes: adds programs to the built-in table or replaces their probes.
    toolchain_programs: Mapping[str, tuple[str, ...]] = {}
    sync_excludes: tuple[str, ...] = ()
    groups: Mapping[str, int] = {}
    # Jobs that may be run again after a slice-full kill (254), as with --requeue: label patterns
    # (fnmatch) and groups ([groups.NAME] requeue = true).
    requeue_labels: tuple[str, ...] = ()
    requeue_groups: tuple[str, ...] = ()
    queue_policy: str = "backfill"  # one of QUEUE_POLICIES
    clear_mark_after: int = 3  # clean runs at its cap that clear a label's slice-full mark
    history_days: float = 90.0  # the run history keeps rows this many days ...
    history_rows: int = 100_000  # ... and at most this many
    agents: AgentSettings = AgentSettings()
    sessions: SessionSettings = SessionSettings()
    source: str = "<built-in default>"
    # Environment variables that replace a kind's own key on every host of that kind: VAR -> (kind,
    # key), from the kinds' key tables (``Key.env``) when the file was parsed.
    overrides: Mapping[str, tuple[str, str]] = {}

    @classmethod
    def default(cls, **changes: Any) -> Settings:
        """The embedded default: this host only, state in ``$XDG_STATE_HOME/hostrun``."""
        values: dict[str, Any] = {"state_dir": default_state_dir(),
                                  "hosts": {LOCAL: HostSettings(LOCAL, LOCAL)}}
        values.update(changes)
        return cls(**values)

    @property
    def local(self) -> HostSettings:
        return self.hosts[LOCAL]

    @property
    def alerts_path(self) -> str:
        return self.alert_file or os.path.join(self.state_dir, "alerts.jsonl")

    @property
    def history_keep(self) -> tuple[float, int]:
        """(days, rows) the run history keeps."""
        return (self.history_days, self.history_rows)

    def may_requeue(self, label: str, group: str | None, asked: bool) -> bool:
        """Whether a job may run again after a slice-full kill: ``--requeue``, a matching
        ``requeue_labels`` pattern, or a group with ``requeue = true``."""
        if asked or (group is not None and group in self.requeue_groups):
            return True
        if not self.requeue_labels:
            return False
        from fnmatch import fnmatchcase

        return any(fnmatchcase(label, pattern) for pattern in self.requeue_labels)

    def gamble_size_for(self, host: HostSettings) -> int:
        return host.gamble_size if host.gamble_size is not None else self.gamble_size

    def to_normalized(self) -> dict[str, Any]:
        data = self._asdict()
        data["hosts"] = {name: h._asdict() for name, h in self.hosts.items()}
        data["agents"] = self.agents._asdict()
        data["sessions"] = self.sessions._asdict()
        return data

    @classmethod
    def from_normalized(cls, data: Mapping[str, Any]) -> Settings:
        hosts = {name: HostSettings(**h) for name, h in data["hosts"].items()}
        overrides = {var: tuple(where) for var, where in data.get("overrides", {}).items()}
        agents = AgentSettings(**data["agents"]) if "agents" in data else AgentSettings()
        sessions = SessionSettings(**data["sessions"]) if "sessions" in data else SessionSettings()
        return cls(**{**data, "hosts": hosts, "overrides": overrides, "agents": agents,
                      "sessions": sessions})

    def with_env_overrides(self, environ: Mapping[str, str]) -> Settings:
        """Apply ``ENABLE_ACROSS_MACHINES`` and the kinds' own variables (``overrides``, e.g.
        ``PEER_MEMORY_CAP``: they beat the file), and resolve a ``state_dir`` the file left unset from
        ``$XDG_STATE_HOME``/``$HOME``."""
        from dispatch.core.errors import ConfigError
        from dispatch.core.units import parse_size

        changes: dict[str, Any] = {}
        if not self.state_dir:
            changes["state_dir"] = default_state_dir(environ)
        flag = environ.get("ENABLE_ACROSS_MACHINES")
        if flag:
            lowered = flag.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ConfigError(f"ENABLE_ACROSS_MACHINES={flag!r}: use 1 or 0")
            changes["enable_across_machines"] = lowered in ("1", "true", "yes", "on")
        hosts = dict(self.hosts)
        for var, (kind, key) in self.overrides.items():
            value = environ.get(var)
            if not value:
                continue
            try:
                size = parse_size(value)  # every such key is a size so far
            except ValueError as exc:
                raise ConfigError(f"{var}: {exc}") from None
            for name, h in hosts.items():
                if h.kind_name == kind:
                    hosts[name] = h._replace(options={**h.options, key: size})
            changes["hosts"] = hosts
        return self._replace(**changes) if changes else self


def cgroup_path_problem(value: object) -> str | None:
    """Why a configured ``cgroup`` (the slice's path in the hierarchy) is refused, or None.

    Only plain names: ``..`` would place the slice anywhere (``<own>/x/../../../escape`` is the
    hierarchy's root), and ``.`` or empty components make one slice look like several.
    """
    if not isinstance(value, str):
        return "must be a string"
    if not value.startswith("/"):
        return "must be an absolute path inside the hierarchy, e.g. /hostrun"
    parts = value[1:].split("/")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()  # one trailing slash is harmless
    if parts == [""]:
        return "must name a cgroup below the root of the hierarchy, e.g. /hostrun"
    bad = next((p for p in parts if p in ("", ".", "..") or "\0" in p), None)
    if bad is not None:
        what = "an empty component (//)" if bad == "" else f"a {bad!r} component"
        return f"must be a plain path without {what}: {value}"
    return None
