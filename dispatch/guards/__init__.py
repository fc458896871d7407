"""Whether and where a job may run: preflight headers, locks, work dirs, toolchains, trust.

Standard library only; shipped to peers.
"""

from __future__ import annotations

from dispatch.core.faces import lazy_attributes

# What the command line may use of this part (dispatch.core.faces), each loaded when first asked for.
SURFACE: dict[str, str] = {
    "hidden_note": "dispatch.guards.workdirs",
    "script_path": "dispatch.guards.headers",
}
__all__ = ["hidden_note", "script_path"]
MYPY = False
if MYPY:
    from dispatch.guards.headers import script_path as script_path
    from dispatch.guards.workdirs import hidden_note as hidden_note

__getattr__ = lazy_attributes(__name__, SURFACE)
