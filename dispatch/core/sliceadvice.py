"""What to write where for a slice that holds the jobs: the one source of slice advice.

The 78 of a default reserve that leaves no slice, the 243 of a cap larger than the slice and
``doctor``'s slice problems all say the line to add and the file to add it to from here, and the
README's figures are checked against it (tests/system/test_slice_advice.py), so they never disagree.
Standard library only: a peer's agent gives the same advice about its own machine.
"""

from __future__ import annotations

import os

from dispatch.core.units import GiB, MiB, format_size

MYPY = False
if MYPY:
    from collections.abc import Mapping

STEP = 128 * MiB  # advised sizes are whole steps: a line a person can read and type
LEAST = 256 * MiB  # the smallest slice worth having (below it the default reserve gives 78)
# An advised slice leaves at least a quarter of the RAM for everything outside hostrun's jobs
# (the system, the user's session, hostrun itself); a cap that needs more is refused as too big.
MOST_NUM, MOST_DEN = 3, 4
DEFAULT_RESERVE_TEXT = "max(2 GiB, RAM/5)"


def default_reserve(mem_total: int) -> int:
    """The reserve when neither ``slice`` nor ``reserve`` is set: a fifth of the RAM, at least 2 GiB."""
    return max(2 * GiB, mem_total // 5)


def most(mem_total: int) -> int:
    """The largest slice ever advised on a machine with ``mem_total`` bytes of RAM."""
    return max(LEAST, mem_total * MOST_NUM // MOST_DEN // STEP * STEP)


def advised(mem_total: int, cap: int | None = None) -> int | None:
    """The slice to advise: half the RAM in whole steps (at least ``LEAST``); for a cap larger than
    that, the cap rounded up to a step while it stays within ``most``; None for a cap no advised
    slice holds (the fix is a smaller ``-m``, not a bigger slice)."""
    half = max(LEAST, mem_total // 2 // STEP * STEP)
    if cap is None or cap <= half:
        return half
    wanted = -(-cap // STEP) * STEP
    return wanted if wanted <= most(mem_total) else None


def toml_size(size: int) -> str:
    """``1G``, ``896M``: how the advice writes a size (a whole number of GiB or MiB)."""
    return f"{size // GiB}G" if size % GiB == 0 else f"{size // MiB}M"


def config_file(source: str, environ: Mapping[str, str] | None = None) -> str:
    """The file to write a key in: the config file in use (``Settings.source``), else the per-user
    one hostrun reads when nothing else is given (``$XDG_CONFIG_HOME/hostrun/hosts.toml``, the path
    spelled out: ``~`` means nothing to a user whose HOME is elsewhere)."""
    if os.path.isabs(source):
        return source
    env = os.environ if environ is None else environ
    from dispatch.core.configpath import user_home

    home = env.get("XDG_CONFIG_HOME") or os.path.join(user_home(env), ".config")
    return os.path.join(home, "hostrun", "hosts.toml")


def line_to_add(host: str, size: int, config: str, key: str = "") -> str:
    """The instruction: the exact TOML line, its table and its file. ``key``: the sizing key the
    table already has (``slice``: changed; ``reserve``: replaced, as the two exclude each other)."""
    line = f'slice = "{toml_size(size)}" under [hosts.{host}] in {config}'
    if key == "slice":
        return f"change it to {line}"
    if key == "reserve":
        return f"replace hosts.{host}.reserve with {line}"
    return f"add {line}"


def no_slice(host: str, mem_total: int, config: str, cap: int | None = None) -> str:
    """The 78 of a default reserve that leaves no slice: the RAM, the reserve, the line to add (one
    that holds ``cap`` too, when the run asked for one that fits an advised slice)."""
    size = advised(mem_total, cap) or advised(mem_total)
    assert size is not None
    return (f"this machine has {format_size(mem_total)} of RAM, and the default reserve "
            f"({DEFAULT_RESERVE_TEXT} = {format_size(default_reserve(mem_total))}, kept for everything "
            f"outside hostrun's jobs) leaves no slice for them: {line_to_add(host, size, config)}")


def too_big(cap: int, limit: int, how: str, fix: str) -> str:
    """The 243 of a cap larger than the slice: where the slice's size came from (``how``) and what to
    do (``fix``: from ``bigger``)."""
    return (f"cap {format_size(cap)} is larger than the whole slice ({format_size(limit)}: {how}); "
            f"it could never be admitted: {fix}")


def bigger(host: str, cap: int, mem_total: int, config: str, key: str) -> str:
    """How to make the slice hold ``cap``: the line to write, or, when no advised slice would hold
    it, the largest cap this machine can be given."""
    size = advised(mem_total, cap)
    if size is None:
        return (f"this machine has {format_size(mem_total)} of RAM, and a slice leaves a quarter of it "
                f"at least for everything else: ask for -m {toml_size(most(mem_total))} or less")
    return f"ask for a smaller -m, or {line_to_add(host, size, config, key)}"  # the path ends the line


def over_ram(host: str, slice_bytes: int, mem_total: int, config: str) -> str | None:
    """``doctor``'s problem with a configured slice at or above the RAM, or None: its jobs together
    could take the whole machine, the system and the user's session included."""
    if slice_bytes < mem_total:
        return None
    size = advised(mem_total)
    assert size is not None
    return (f"hosts.{host}.slice {format_size(slice_bytes)} is not less than this machine's "
            f"{format_size(mem_total)} of RAM: its jobs together could take all of it, and nothing "
            f"would be left for the system and your session; {line_to_add(host, size, config, 'slice')}")
