"""pydantic models of ``hosts.toml`` (the edge: imported only when a file must be validated).

Every model forbids unknown keys, so a typo is an error naming the key, never a silent default. The
``[hosts.NAME]`` model is built from the key tables (``dispatch.core.hostkeys.COMMON`` and each
registered kind's ``KindSpec``, ``dispatch.hosts.kinds``), and so are the checks of which kind a key
is for: a key is declared once, with its type tag.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from dispatch.capping import BACKENDS
from dispatch.core import hostkeys
from dispatch.core.configfile import queue_policy_problem, settings_from_dict
from dispatch.core.errors import ConfigError
from dispatch.core.hostkeys import COMMON, Key, KindSpec, inferred_kind, kind_problem
from dispatch.core.settings import AGENT_MODES, AgentSettings, Settings
from dispatch.core.units import MIN_SIZE, format_size, parse_duration, parse_size


def _size(value: Any) -> int:
    if isinstance(value, float):
        raise ValueError(f"not a size: {value!r} (use e.g. 512M, 8G, 1.5GiB)")
    return parse_size(value)


def _duration(value: Any) -> float:
    return parse_duration(value)


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


def _queue_policy(value: Any) -> str:
    problem = queue_policy_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return str(value)


_ANNOTATIONS: dict[str, Any] = {
    hostkeys.SIZE: Optional[Size], hostkeys.MEMORY_SIZE: Optional[MemorySize],
    hostkeys.DURATION: Optional[Duration], hostkeys.POSITIVE_DURATION: Optional[PositiveDuration],
    hostkeys.INT: Optional[int], hostkeys.COUNT: Optional[Count], hostkeys.BOOL: Optional[bool],
    hostkeys.POSITIVE_NUMBER: Optional[Number], hostkeys.WORDS: Optional[list[str]],
    hostkeys.QUEUE_POLICY: Optional[Annotated[str, BeforeValidator(_queue_policy)]],
}


def _field(key: Key) -> tuple[Any, Any]:
    """The pydantic field of a key, from its type tag (a string unless the tag says otherwise)."""
    positive = 0 if key.type == hostkeys.POSITIVE_NUMBER else None
    return (_ANNOTATIONS.get(key.type, Optional[str]),
            Field(default=None, ge=key.low, le=key.high, gt=positive))


class _HostBase(_Strict):
    kind: Optional[str] = None

    def check(self, name: str, spec: KindSpec, kinds: tuple[KindSpec, ...]) -> None:
        """The rules no single key's type says, in this order: ``slice`` or ``reserve``; a reserve
        this machine can hold; a known backend; the kind's required keys; no key of another kind;
        none of the shared keys the kind refuses."""
        if self.value("slice") is not None and self.value("reserve") is not None:
            raise ValueError("set either slice or reserve, not both")
        reserve = self.value("reserve")
        if spec.here and reserve is not None:
            from dispatch.core.hostfacts import read_meminfo

            total = read_meminfo().total
            if total - reserve < MIN_SIZE:
                raise ValueError(f"reserve {format_size(reserve)} leaves no slice: this machine "
                                 f"has {format_size(total)} of RAM")
        for key in COMMON:
            if key.type == hostkeys.BACKEND and self.value(key.key) not in (None, *BACKENDS):
                raise ValueError(f"{key.key} must be one of {', '.join(BACKENDS)}")  # the one registry
        for key in spec.keys:
            if key.required and not self.value(key.key):
                raise ValueError(key.required)
        own = {key.key for key in spec.keys}
        for other in kinds:
            for key in other.keys:
                if key.key not in own and self.value(key.key) is not None:
                    raise ValueError(spec.foreign.format(key=key.key, kind=spec.name))
        for key_name, why in spec.refused:
            if self.value(key_name) is not None:
                raise ValueError(why)

    def value(self, key: str) -> Any:
        return getattr(self, key, None)


class GroupModel(_Strict):
    max_running: Optional[int] = Field(default=None, ge=1)
    requeue: bool = False


AGENT_DEFAULTS = AgentSettings._field_defaults


def _agent_mode(value: Any) -> str:
    if value not in AGENT_MODES:
        raise ValueError(f"must be one of {', '.join(AGENT_MODES)}, not {value!r}")
    return str(value)


def _patterns(value: Any) -> list[str]:
    """Patterns (``dispatch.hooks.rules``): a list of non-blank strings."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a list of patterns (strings)")
    blank = next((i for i, v in enumerate(value) if not v.split()), None)
    if blank is not None:
        raise ValueError(f"pattern {blank + 1} is blank")
    return value


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or not value.isidentifier() or not value.isascii():
        raise ValueError(f"must be an environment variable name, not {value!r}")
    return value


class AgentsModel(_Strict):
    """``[agents]``: the coding-agent hooks (docs/agents.md)."""

    mode: Annotated[str, BeforeValidator(_agent_mode)] = AGENT_DEFAULTS["mode"]
    heavy: Annotated[list[str], BeforeValidator(_patterns)] = Field(default_factory=list)
    light: Annotated[list[str], BeforeValidator(_patterns)] = Field(default_factory=list)
    gpu: Annotated[list[str], BeforeValidator(_patterns)] = Field(default_factory=list)
    escape_env: Annotated[str, BeforeValidator(_env_name)] = AGENT_DEFAULTS["escape_env"]
    escape_min: int = Field(default=AGENT_DEFAULTS["escape_min"], ge=1, le=1000)
    subagent_suite: Literal["refuse", "allow"] = AGENT_DEFAULTS["subagent_suite"]


class SessionsModel(_Strict):
    """``[sessions]``: agent sessions under the budget (docs/agents.md, "Sessions under the
    budget")."""

    share: float = Field(default=0.5, gt=0, le=1)
    cap: MemorySize = 4608 << 20
    first_booking: MemorySize = 2 << 30
    high: float = Field(default=0.9, gt=0, le=1)
    place: bool = Field(default=False, strict=True)  # true or false, not "yes" or 1

    @model_validator(mode="after")
    def _booking_within_cap(self) -> SessionsModel:
        if self.first_booking > self.cap:
            raise ValueError(f"first_booking {format_size(self.first_booking)} is larger than cap "
                             f"{format_size(self.cap)}: a session is never booked above its cap")
        return self


class _ConfigBase(_Strict):
    """The top level's tables; its scalar keys are ``hostkeys.TOP``'s (``config_model`` adds them).
    Every default is ``Settings``' own: ``settings_from_dict`` builds the Settings from the file,
    this model only says what is allowed."""

    toolchain_programs: dict[str, list[str]] = Field(default_factory=dict)
    groups: dict[str, GroupModel] = Field(default_factory=dict)  # Settings: no groups either
    agents: AgentsModel = Field(default_factory=AgentsModel)
    sessions: SessionsModel = Field(default_factory=SessionsModel)


@lru_cache(maxsize=8)
def config_model(kinds: tuple[KindSpec, ...]) -> type[BaseModel]:
    """The file's model for these host kinds: ``hosts`` maps a name to a table that may hold the
    shared keys and any kind's own (which kind a key is for is ``_HostBase.check``'s to say, so
    that a key in the wrong table is named as such, not as unknown)."""
    fields: dict[str, Any] = {key.key: _field(key) for key in COMMON}
    for spec in kinds:
        fields.update({key.key: _field(key) for key in spec.keys if key.key not in fields})
    host_model = create_model("HostModel", __base__=_HostBase, **fields)
    top: dict[str, Any] = {key.key: _field(key) for key in hostkeys.TOP}
    return create_model("ConfigModel", __base__=_ConfigBase, **top,
                        hosts=(dict[str, host_model], Field(default_factory=dict)))  # type: ignore[valid-type]


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
    from dispatch.hosts.kinds import specs

    known = specs()
    raw = _load_toml(path, data)
    try:
        model: Any = config_model(tuple(known.values())).model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key also makes the real one "missing": name the misspelling, it is the cause.
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(f"{path}: {_location(err['loc'])}: {msg}") from None
    for name, host in model.hosts.items():
        kind = host.kind if host.kind is not None else inferred_kind(name)
        if kind not in known:
            raise ConfigError(f"{path}: hosts.{name}.kind: unknown kind {kind!r} (known: "
                              f"{', '.join(known)})")
        problem = kind_problem(name, kind)
        if problem is not None:
            raise ConfigError(f"{path}: hosts.{name}.kind: {problem}")
        try:
            host.check(name, known[kind], tuple(known.values()))
        except ValueError as exc:
            raise ConfigError(f"{path}: hosts.{name}: {exc}") from None
    return settings_from_dict(raw, path, known)
