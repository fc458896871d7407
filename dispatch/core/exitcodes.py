"""The one table of hostrun's own exit codes (docs/design.md, "Exit codes"; docs/exit-codes.md).

A job's own exit status passes through unchanged; a job killed by signal N gives 128+N. Every other
outcome hostrun can report has a distinct code here, so a caller never has to guess from a number.
"""

from __future__ import annotations

from errno import ENOENT

MYPY = False
if MYPY:
    from enum import IntEnum as _IntEnum
    from typing import Any
else:
    class _Members(type):
        """``enum.IntEnum``'s behaviour that hostrun uses (members as ints with a ``name`` and a
        ``value``, lookup by value, iteration in order, the same repr and str), without importing
        ``enum``: it brings functools and collections, ~3 ms of every run's start (mypy sees
        ``IntEnum``)."""

        def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> type:
            values = {k: v for k, v in ns.items() if not k.startswith("_") and type(v) is int}
            cls = super().__new__(mcls, name, bases, {k: v for k, v in ns.items() if k not in values})
            cls._members = {}
            for key, value in values.items():
                member = int.__new__(cls, value)
                member._name_ = key
                setattr(cls, key, member)
                cls._members[value] = member
            return cls

        def __iter__(cls) -> Any:
            return iter(cls._members.values())

        def __len__(cls) -> int:
            return len(cls._members)

        def __contains__(cls, value: object) -> bool:
            return isinstance(value, cls) or (type(value) is int and value in cls._members)

        def __call__(cls, value: int) -> Any:
            try:
                return cls._members[value]
            except (KeyError, TypeError):
                raise ValueError(f"{value!r} is not a valid {cls.__name__}") from None

        @property
        def __members__(cls) -> dict[str, Any]:
            return {m._name_: m for m in cls._members.values()}

    class _IntEnum(int, metaclass=_Members):
        _name_: str

        @property
        def name(self) -> str:
            return self._name_

        @property
        def value(self) -> int:
            return int(self)

        def __repr__(self) -> str:
            return f"<{type(self).__name__}.{self._name_}: {int(self)}>"

        __str__ = int.__repr__
        __format__ = int.__format__

        def __reduce__(self) -> Any:
            return type(self), (int(self),)


class ExitCode(_IntEnum):
    """hostrun's own outcomes. The enum name, lower-cased with dashes, is the outcome name."""

    USAGE = 2
    NOT_RUN = 78
    NEVER_FITS = 243
    LONG_SINGLE_HOST = 244
    VRAM = 245
    PEER_UNREACHABLE = 246
    TOOLCHAIN_MISMATCH = 247
    ACROSS_DISABLED = 248
    OVER_PEER_CAP = 249
    OWN_CAP = 250
    CONNECTION_LOST = 251
    SYNC_FAILED = 252
    MAX_RUNTIME = 253
    SLICE_FULL = 254

    @property
    def outcome(self) -> str:
        return self.name.lower().replace("_", "-")

    @property
    def meaning(self) -> str:
        return MEANINGS[self]


MEANINGS: dict[ExitCode, str] = {
    ExitCode.USAGE: "bad arguments or configuration; nothing ran",
    ExitCode.NOT_RUN: "a precondition was not met (a script's preflight condition, no usable "
    "memory-cap backend, a cgroup that could not be prepared, a state dir that cannot be written, "
    "'lock --wait' ran out, 'agents status' found a hook not working); nothing ran",
    ExitCode.NEVER_FITS: "the job's cap is larger than the host's whole slice (on a cluster: than every "
    "node); it could never be admitted",
    ExitCode.LONG_SINGLE_HOST: "recorded or declared duration over the long-job threshold on one host "
    "without a long-job declaration",
    ExitCode.VRAM: "GPU memory shortage during the run",
    ExitCode.PEER_UNREACHABLE: "the peer was needed but could not be reached or read in time",
    ExitCode.TOOLCHAIN_MISMATCH: "the peer's toolchain differs from this host's",
    ExitCode.ACROSS_DISABLED: "a peer was asked for while enable_across_machines is off",
    ExitCode.OVER_PEER_CAP: "the cap exceeds the peer's peer_memory_cap",
    ExitCode.OWN_CAP: "the job was OOM-killed at its own cap",
    ExitCode.CONNECTION_LOST: "the connection to the peer broke during the run; the remote job was stopped",
    ExitCode.SYNC_FAILED: "the tree could not be synced to the peer",
    ExitCode.MAX_RUNTIME: "the job ran past its max runtime and was stopped",
    ExitCode.SLICE_FULL: "the job was OOM-killed because the slice was full, though under its own cap",
}

def outcome_name(code: int) -> str:
    """The outcome name a result records for a hostrun error's code; "error" for a code that is not
    one of hostrun's own (a plain HostrunError given some other number)."""
    try:
        return ExitCode(code).outcome
    except ValueError:
        return "error"


SIGNAL_BASE = 128
NOT_FOUND = 127  # as shells do: the command was not found
CANNOT_EXECUTE = 126  # found, but could not be executed


def from_wait_status(status: int) -> tuple[int, str]:
    """A raw wait status as an exit code and outcome: the process's own code ("exit"), or 128+N
    when signal N killed it ("signal"), as shells report it."""
    import os

    if os.WIFSIGNALED(status):
        return SIGNAL_BASE + os.WTERMSIG(status), "signal"
    return os.WEXITSTATUS(status), "exit"


def interrupted(signum: int) -> int:
    """What hostrun exits with when signal ``signum`` ended it (Ctrl-C: 130, a closed pipe: 141)."""
    return SIGNAL_BASE + signum


def exec_failure(exc: Exception) -> tuple[int, str]:
    """The exit code and reason for a command that could not be started, as a shell gives them:
    127 when it is not found (or its name is empty: Python refuses that with ValueError), 126 when
    it cannot be executed."""
    if not isinstance(exc, OSError):
        return NOT_FOUND, "command not found"
    return (NOT_FOUND if exc.errno == ENOENT else CANNOT_EXECUTE), exc.strerror or str(exc)
