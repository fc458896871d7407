"""What a script declares about itself for preflight (``# admission:``, ``# run-condition:``), parsed
into a ``Script`` and its ``Condition`` records; ``dispatch.local.run.preflight`` checks them on this machine.

Apart from the checks because parsing is text alone, while every check reads this machine (PATH,
the GPUs, the ledger's room, the state files): the header grammar and its error messages are one
idea, read here. A malformed header is a ConfigError naming ``SCRIPT:LINE`` (like a config file's
key: exit 2, its own words, no pointer to ``--help``). Standard library only;
``dispatch.local.run.preflight`` re-exports these names.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dispatch.core.errors import ConfigError
from dispatch.core.records import NamedTuple
from dispatch.guards.headers import PREFLIGHT_KEYS, parse_numbered, read_script

MYPY = False
if MYPY:
    from typing import Optional

ADMISSION = "admission"
RUN_CONDITION = "run-condition"
ADMISSION_KINDS = ("inputs-changed",)
CONDITION_KINDS = ("command", "single-instance", "device", "min-free")
DEVICES = ("gpu",)


class Condition(NamedTuple):
    """One declared condition, as parsed from its header line."""

    line: int
    header: str  # ADMISSION or RUN_CONDITION
    kind: str  # "inputs-changed", "command", "single-instance", "device" or "min-free"
    args: tuple[str, ...] = ()
    size: Optional[int] = None  # min-free, in bytes

    @property
    def text(self) -> str:
        return f"{self.header}: {' '.join((self.kind, *self.args))}"


class Script(NamedTuple):
    """A script and the preflight conditions it declares (several admission lines merge into one)."""

    path: str  # as the command names it
    args: tuple[str, ...]  # the script's own arguments
    conditions: tuple[Condition, ...]

    @property
    def real(self) -> str:
        return os.path.realpath(self.path)

    @property
    def directory(self) -> str:
        """Where relative input paths start: the script's directory as named (``dirname "$0"``)."""
        return os.path.dirname(os.path.abspath(self.path))

    @property
    def admission(self) -> Condition | None:
        return next((c for c in self.conditions if c.header == ADMISSION), None)


def declared(argv: Sequence[str]) -> Script | None:
    """The script ``argv`` runs and its preflight conditions; None when it declares none (or no
    script file is involved). A malformed header raises ConfigError naming ``SCRIPT:LINE``."""
    found = read_script(argv)
    if found is None:
        return None
    path, text = found
    rows = [(n, k, v) for n, k, v in parse_numbered(text) if k in PREFLIGHT_KEYS]
    if not rows:
        return None
    conditions: list[Condition] = []
    admission: Condition | None = None
    for number, key, value in rows:
        condition = parse_condition(path, number, key, value)
        if condition.header != ADMISSION:
            conditions.append(condition)
        elif admission is None:
            admission = condition
        else:  # any change among all the admission lines' inputs lets the script run
            admission = admission._replace(args=admission.args + condition.args)
    if admission is not None:
        conditions.insert(0, admission)
    first = 0 if argv[0] == path else 1
    return Script(path=path, args=tuple(argv[first + 1 :]), conditions=tuple(conditions))


def parse_condition(path: str, line: int, key: str, value: str) -> Condition:
    """One ``# admission:``/``# run-condition:`` header; ConfigError ``SCRIPT:LINE: …`` if malformed."""
    import shlex

    where = f"{path}:{line}: {key}"
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    known = ADMISSION_KINDS if key == ADMISSION else CONDITION_KINDS
    if not words:
        raise ConfigError(f"{where}: nothing declared (known: {', '.join(known)})")
    kind, args = words[0], tuple(words[1:])
    if kind not in known:
        what = "admission kind" if key == ADMISSION else "condition"
        raise ConfigError(f"{where}: unknown {what} {kind!r} (known: {', '.join(known)})")
    if kind == "inputs-changed":
        if not args:
            raise ConfigError(f"{where}: inputs-changed needs at least one PATH or env:VAR")
        for arg in args:
            name = arg[4:] if arg.startswith("env:") else None
            if name is not None and not (name.isascii() and name.isidentifier()):
                raise ConfigError(f"{where}: {arg!r} is not an environment variable name")
    elif kind == "command":
        if not args:
            raise ConfigError(f"{where}: command needs at least one TOOL")
    elif kind == "single-instance":
        if args:
            raise ConfigError(f"{where}: single-instance takes no argument (got {' '.join(args)!r})")
    elif kind == "device":
        if len(args) != 1 or args[0] not in DEVICES:
            got = f" (got {' '.join(args)!r})" if args else ""
            raise ConfigError(f"{where}: device needs exactly one of: {', '.join(DEVICES)}{got}")
    elif kind == "min-free":
        if len(args) != 1:
            raise ConfigError(f"{where}: min-free needs exactly one SIZE (e.g. 4G)")
        from dispatch.core.units import parse_size

        try:
            size = parse_size(args[0])
        except ValueError as exc:
            raise ConfigError(f"{where}: min-free: {exc}") from None
        return Condition(line, key, kind, args, size)
    return Condition(line, key, kind, args)
