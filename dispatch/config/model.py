"""pydantic models of ``hosts.toml`` (the edge: imported only when a file must be validated).

Every model forbids unknown keys, so a typo is an error naming the key, never a silent default.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from dispatch.core.configfile import settings_from_dict
from dispatch.core.errors import ConfigError
from dispatch.core.settings import LOCAL, Settings
from dispatch.core.units import format_size, parse_duration, parse_size


def _size(value: Any) -> int:
    if isinstance(value, float):
        raise ValueError(f"not a size: {value!r} (use e.g. 512M, 8G, 1.5GiB)")
    return parse_size(value)


def _duration(value: Any) -> float:
    return parse_duration(value)


MIN_SIZE = 1 << 20  # below 1 MiB no cap, slice or booking can hold a process at all


def _memory_size(value: Any) -> int:
    size = _size(value)
    if size < MIN_SIZE:
        raise ValueError(f"{value!r} is too small: at least 1M (nothing runs in less)")
    return size


Size = Annotated[int, BeforeValidator(_size)]
MemorySize = Annotated[int, BeforeValidator(_memory_size)]
def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r}: must be longer than 0")
    return seconds


Duration = Annotated[float, BeforeValidator(_duration)]
PositiveDuration = Annotated[float, BeforeValidator(_positive_duration)]
def _number(value: Any) -> Any:
    """A plain TOML number: ``true`` or ``"90"`` is a mistake, not 1 or 90."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number: {value!r}")
    return value


Number = Annotated[float, BeforeValidator(_number)]
Count = Annotated[int, BeforeValidator(_number)]
BACKENDS = ("systemd", "cgroup2", "cgroup1", "none")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class HostModel(_Strict):
    slice: Optional[MemorySize] = None
    reserve: Optional[Size] = None
    heavy_threads: Optional[int] = Field(default=None, ge=1, le=4096)
    default_cap: Optional[MemorySize] = None
    gamble_size: Optional[MemorySize] = None
    cgroup: Optional[str] = None
    backend: Optional[str] = None
    ssh: Optional[str] = None
    port: Optional[int] = Field(default=None, ge=1, le=65535)
    ssh_config: Optional[str] = None
    identity_file: Optional[str] = None
    work_root: Optional[str] = None
    python: Optional[str] = None
    peer_memory_cap: Optional[MemorySize] = None
    max_runtime: Optional[PositiveDuration] = None

    def check(self, name: str) -> None:
        if self.slice is not None and self.reserve is not None:
            raise ValueError("set either slice or reserve, not both")
        if name == LOCAL and self.reserve is not None:
            from dispatch.core.hostfacts import read_meminfo

            total = read_meminfo().total
            if total - self.reserve < MIN_SIZE:
                raise ValueError(f"reserve {format_size(self.reserve)} leaves no slice: this machine "
                                 f"has {format_size(total)} of RAM")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
        if name != LOCAL and not self.ssh:
            raise ValueError("a peer needs ssh = 'destination'")
        peer_only = ("ssh", "port", "ssh_config", "identity_file", "work_root", "python",
                     "peer_memory_cap")
        if name == LOCAL and any(getattr(self, key) is not None for key in peer_only):
            key = next(key for key in peer_only if getattr(self, key) is not None)
            raise ValueError(f"{key} is for peers; local is this machine")
        if name != LOCAL and self.max_runtime is not None:
            raise ValueError("max_runtime of a peer is set in the peer's own config ([hosts.local] "
                             "there); --max-runtime goes along with the job")


class GroupModel(_Strict):
    max_running: int = Field(ge=1)


DEFAULTS = Settings._field_defaults  # the one place the top-level defaults are written


class ConfigModel(_Strict):
    """The top level. Its defaults are ``Settings``' own (``settings_from_dict`` builds the Settings
    from the file; this model only says what is allowed)."""

    state_dir: Optional[str] = None  # unset: resolved from $XDG_STATE_HOME/$HOME on every load
    alert_file: Optional[str] = DEFAULTS["alert_file"]
    long_job_threshold: Duration = DEFAULTS["long_job_threshold"]
    pending_window: Duration = DEFAULTS["pending_window"]
    report_timeout: PositiveDuration = DEFAULTS["report_timeout"]
    report_deadline: PositiveDuration = DEFAULTS["report_deadline"]
    enable_across_machines: bool = DEFAULTS["enable_across_machines"]
    gamble_size: MemorySize = DEFAULTS["gamble_size"]
    status_interval: PositiveDuration = DEFAULTS["status_interval"]
    alert_wait_after: Duration = DEFAULTS["alert_wait_after"]
    kill_grace: Duration = DEFAULTS["kill_grace"]
    control_persist: Duration = DEFAULTS["control_persist"]
    toolchain_probes: list[str] = Field(default_factory=lambda: list(DEFAULTS["toolchain_probes"]))
    sync_excludes: list[str] = Field(default_factory=lambda: list(DEFAULTS["sync_excludes"]))
    groups: dict[str, GroupModel] = Field(default_factory=dict)  # Settings: no groups either
    clear_mark_after: int = Field(default=DEFAULTS["clear_mark_after"], ge=1, le=1000)
    history_days: Number = Field(default=DEFAULTS["history_days"], gt=0)
    history_rows: Count = Field(default=DEFAULTS["history_rows"], ge=1)
    hosts: dict[str, HostModel] = Field(default_factory=dict)


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _load_toml(path: str, data: bytes | None = None) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10 only
        import tomli as tomllib
    try:
        if data is not None:
            return tomllib.loads(data.decode())
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                          f"at offset {exc.start})") from None


def validate_file(path: str, data: bytes | None = None) -> Settings:
    """Settings from a TOML file (``data``: its bytes, already read and trust-checked by the caller),
    or ConfigError with one line naming the file and key."""
    raw = _load_toml(path, data)
    try:
        model = ConfigModel.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key also makes the real one "missing": name the misspelling, it is the cause.
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(f"{path}: {_location(err['loc'])}: {msg}") from None
    for name, host in model.hosts.items():
        try:
            host.check(name)
        except ValueError as exc:
            raise ConfigError(f"{path}: hosts.{name}: {exc}") from None
    return settings_from_dict(raw, path)
