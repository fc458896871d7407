"""A part's face: the names the command line may use of it (``SURFACE``: name → ``module`` or
``module:attribute``), loaded only when first asked for (PEP 562's module ``__getattr__``), so that
importing a part costs nothing on the hot path. ``tests/fast/test_surfaces.py`` holds every face to its
``__all__`` and typing block, and ``dispatch.cli`` to importing faces only."""

from __future__ import annotations

import sys

MYPY = False
if MYPY:
    from collections.abc import Callable, Mapping


def lazy_attributes(package: str, surface: Mapping[str, str]) -> Callable[[str], object]:
    """The ``__getattr__`` of ``package``'s face."""
    def attribute(name: str) -> object:
        module, _, attr = surface.get(name, "").partition(":")
        if not module:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        __import__(module)
        return getattr(sys.modules[module], attr or name)
    return attribute
