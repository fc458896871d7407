"""What a host says about itself in ``hostrun report``: plain text in lines and tables, with a style
name on the parts a terminal shows in colour.

The host (``Host.describe``) decides what to say, because only its kind knows its report's shape;
the renderer (``dispatch.cli.render``, the one module that imports rich) decides how it looks, and
escapes every text it is given. So a new host kind is shown without editing the renderer.
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Sequence
    from typing import Optional, Union

    from dispatch.core.reportshape import RunningJob

# style names the renderer knows
BOLD = "bold"
RED = "red"


class Span(NamedTuple):
    """A piece of text, ``style`` one of the names above or empty."""

    text: str
    style: str = ""


class Line(NamedTuple):
    """One line of text."""

    spans: tuple[Span, ...]


class Grid(NamedTuple):
    """A table: a ``title``, its ``columns`` (``header`` False: a what/value table shown without
    them), its rows of cells; with no rows, ``empty`` is said instead (None: the empty table)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Span, ...], ...]
    header: bool = True
    empty: Optional[str] = None


if MYPY:  # for annotations only: no run-time name, as typing stays off the report path
    Block = Union[Line, Grid]


def line(*parts: str | Span) -> Line:
    """A line from texts and spans."""
    return Line(tuple(p if isinstance(p, Span) else Span(p) for p in parts))


def row(*cells: str | Span) -> tuple[Span, ...]:
    """A table row from texts and spans."""
    return tuple(c if isinstance(c, Span) else Span(c) for c in cells)


# more style names, for ``hostrun top``'s bars and marks
YELLOW = "yellow"
GREEN = "green"
DIM = "dim"


class Gauge(NamedTuple):
    """One line of a host's panel in ``hostrun top`` (``Host.gauges``): ``name``, a bar of ``total``
    filled to ``used`` and on to ``booked`` (promised but not used yet), and ``text`` saying it in
    words; ``total`` 0: no bar, the text alone. Plain numbers, so any kind can say any resource."""

    name: str
    text: str
    used: float = 0
    booked: float = 0
    total: float = 0


def report_id(value: object) -> Optional[Union[int, str]]:
    """A booking id as a report gives it (``id``, ``in_session``), or None for anything else: a
    peer's odd report must not break the view."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def session_names(running: Sequence[RunningJob]) -> dict[Union[int, str], str]:
    """Each running agent session's id -> the name its jobs show (``in_session``): its label, with
    its id where another running session has the same label (two sessions of one agent)."""
    sessions = [(key, str(j.get("label") or "")) for j in running
                if j.get("role") == "session" and (key := report_id(j.get("id"))) is not None]
    labels = [label for _, label in sessions]
    return {key: label if labels.count(label) == 1 else f"{label} #{key}" for key, label in sessions}
