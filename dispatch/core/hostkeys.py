"""The keys of ``hosts.toml``, declared once (standard library only: the agent parses with them too):
the top level's scalar keys (``TOP``) and the ``[hosts.NAME]`` keys.

A host *kind* (``local``, ``ssh``, ...) is declared by a ``KindSpec``: its own keys, each a ``Key``
with a type tag, plus the rules that are the kind's to make. Every kind shares ``COMMON``: the keys
of hostrun's own runner on that host (slice, cgroup, backend, ...). Everything about a key is derived
from these tables: the pydantic model that validates a user's file (``dispatch.config.model``), the
plain parser (``dispatch.core.configfile``, also the agent's), the checks of which kind a key is
for, the keys the controller hands a peer as fallbacks. The ``local`` kind is declared here because
the agent on a peer knows it (it runs hostrun's own runner there); the other kinds are declared in
their own modules under ``dispatch/hosts/`` and registered in ``dispatch.hosts.kinds``.
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple
from dispatch.core.settings import DEFAULT_PEER_KIND as DEFAULT_PEER_KIND
from dispatch.core.settings import LOCAL as LOCAL
from dispatch.core.settings import inferred_kind as inferred_kind

MYPY = False
if MYPY:
    from typing import Optional


# Type tags: what a value is in the file, how both parsers read it.
SIZE = "size"  # bytes: 512M, 8G
MEMORY_SIZE = "memory_size"  # a size of at least 1 MiB
POSITIVE_DURATION = "positive_duration"  # seconds: 90m, > 0
INT = "int"  # a whole number within low..high
TEXT = "text"  # a string, as is
PATH = "path"  # a file on this machine: a leading ~ is expanded; trust-checked on every load
CGROUP = "cgroup"  # an absolute path in the cgroup hierarchy (checked by ``cgroup_path_problem``)
BACKEND = "backend"  # one of the cap backends' names
WORDS = "words"  # a list of strings (arguments handed on as they are), kept as a tuple
DURATION = "duration"  # seconds: 90m, >= 0
BOOL = "bool"  # true or false
COUNT = "count"  # a plain TOML integer (not true, not "9") within low..high
POSITIVE_NUMBER = "positive_number"  # a plain TOML number > 0
QUEUE_POLICY = "queue_policy"  # one of ``settings.QUEUE_POLICIES``


class Key(NamedTuple):
    """One key of a ``[hosts.NAME]`` table."""

    key: str  # as written in the file
    field: str  # where its value goes: a HostSettings field (COMMON), else the name in ``options``
    type: str  # a type tag above
    low: Optional[int] = None  # INT bounds
    high: Optional[int] = None
    fallback: bool = False  # handed to a peer's agent for what the peer's own config leaves unset
    required: Optional[str] = None  # the kind needs it: the message when it is missing
    env: Optional[str] = None  # an environment variable that replaces it on every host of the kind


class KindSpec(NamedTuple):
    """A host kind's settings: its own keys and its rules about the shared ones."""

    name: str
    keys: tuple[Key, ...] = ()
    here: bool = False  # this machine: a ``reserve`` is checked against its RAM when validated
    refused: tuple[tuple[str, str], ...] = ()  # (COMMON key, why it is an error on this kind)
    foreign: str = "{key} is not a key of kind {kind}"  # a key of another kind set here


COMMON: tuple[Key, ...] = (
    Key("slice", "slice_bytes", MEMORY_SIZE, fallback=True),
    Key("reserve", "reserve_bytes", SIZE, fallback=True),
    Key("heavy_threads", "heavy_threads", INT, 1, 4096, fallback=True),
    Key("default_cap", "default_cap", MEMORY_SIZE, fallback=True),
    Key("gamble_size", "gamble_size", MEMORY_SIZE, fallback=True),
    Key("cgroup", "cgroup", CGROUP, fallback=True),
    Key("backend", "backend", BACKEND, fallback=True),
    Key("max_runtime", "max_runtime", POSITIVE_DURATION),
)
FALLBACK_FIELDS = tuple(k.field for k in COMMON if k.fallback)

# The top level's scalar keys, each a ``Settings`` field of the same name (its default is there); the
# tables (``[hosts.*]``, ``[groups.*]``, ``[toolchain_programs]``, ``[agents]``) have their own models.
TOP: tuple[Key, ...] = (
    Key("state_dir", "state_dir", PATH),  # unset: resolved from $XDG_STATE_HOME/$HOME on every load
    Key("alert_file", "alert_file", PATH),
    Key("long_job_threshold", "long_job_threshold", DURATION),
    Key("pending_window", "pending_window", DURATION),
    Key("report_timeout", "report_timeout", POSITIVE_DURATION),
    Key("report_deadline", "report_deadline", POSITIVE_DURATION),
    Key("enable_across_machines", "enable_across_machines", BOOL),
    Key("gamble_size", "gamble_size", MEMORY_SIZE),
    Key("default_gpu_memory", "default_gpu_memory", MEMORY_SIZE),
    Key("status_interval", "status_interval", POSITIVE_DURATION),
    Key("alert_wait_after", "alert_wait_after", DURATION),
    Key("kill_grace", "kill_grace", DURATION),
    Key("control_persist", "control_persist", DURATION),
    Key("agent_idle", "agent_idle", DURATION),
    Key("toolchain_probes", "toolchain_probes", WORDS),
    Key("sync_excludes", "sync_excludes", WORDS),
    Key("requeue_labels", "requeue_labels", WORDS),
    Key("clear_mark_after", "clear_mark_after", INT, 1, 1000),
    Key("queue_policy", "queue_policy", QUEUE_POLICY),
    Key("history_days", "history_days", POSITIVE_NUMBER),
    Key("history_rows", "history_rows", COUNT, 1),
)

LOCAL_KIND = KindSpec(LOCAL, here=True, foreign="{key} is for peers; local is this machine")


def kind_problem(name: str, kind: str) -> str | None:
    """Why ``kind`` cannot be the kind of ``[hosts.NAME]`` (said after ``hosts.NAME.kind: ``), or
    None. There is one machine hostrun runs on, and it is named ``local``: the name and the kind go
    together both ways."""
    if name == LOCAL and kind != LOCAL:
        return f"local is this machine, so its kind is local, not {kind!r}"
    if name != LOCAL and kind == LOCAL:
        return "kind 'local' is this machine, which is [hosts.local]; another name is a peer"
    return None
