"""Ramp profiles (docs/admission.md, "Lending"): how fast a label's memory grows within a run.

A run's profile is its cumulative maximum memory at each tenth of its runtime (``POINTS`` values,
bytes; the last is the run's peak). A label's profile on a host is the pointwise maximum over its
recorded runs, so at any phase it is at least what any run had used by then. Booking books only
the peak; lending (``dispatch.local.admission.lending``) also reads when it is reached: a job at a tenth of
its runtime has not grown yet, and a short job may use that room until it does.

Pure functions, standard library only (on the path of every run).
"""

from __future__ import annotations

MYPY = False
if MYPY:
    from collections.abc import Sequence


POINTS = 10
REACHED = 0.9  # the time to peak: the first tenth whose value reaches this share of the peak


def profile(rises: Sequence[tuple[float, int]], duration: float, peak: int) -> tuple[int, ...]:
    """The run's profile from its samples' running maximum, kept at each rise as (seconds since
    start, bytes), over ``duration`` seconds; ``peak``: the run's peak (the last point, and a bound
    on every point: the kernel's high-water mark may exceed every sample)."""
    points = []
    for k in range(1, POINTS + 1):
        at = duration * k / POINTS
        points.append(max((used for when, used in rises if when <= at), default=0))
    points[-1] = max(points[-1], peak)
    return tuple(min(p, points[-1]) for p in points)


def fold(old: Sequence[int] | None, new: Sequence[int]) -> tuple[int, ...]:
    """A label's profile after one more run: the pointwise maximum (never below any run's)."""
    if old is None or len(old) != len(new):
        return tuple(new)
    return tuple(max(a, b) for a, b in zip(old, new))


def encode(points: Sequence[int] | None) -> str | None:
    return None if points is None else ",".join(str(p) for p in points)


def decode(text: str | None) -> tuple[int, ...] | None:
    """A stored profile; None for none, or for text that is not ``POINTS`` whole numbers."""
    if not text:
        return None
    try:
        points = tuple(int(p) for p in text.split(","))
    except ValueError:
        return None
    return points if len(points) == POINTS and all(p >= 0 for p in points) else None


def time_to_peak(points: Sequence[int] | None) -> float | None:
    """The fraction of its runtime by which the label reaches ``REACHED`` of its peak (0.1 .. 1.0)."""
    if not points or points[-1] <= 0:
        return None
    top = points[-1] * REACHED
    return next((k + 1) / POINTS for k, p in enumerate(points) if p >= top)


def at_phase(points: Sequence[int], phase: float) -> int:
    """The most the label uses up to ``phase`` (elapsed / duration) of its run: the point of the
    tenth it is in (point ``k`` is the maximum up to the end of tenth ``k``); the peak beyond 1."""
    if phase < 0:
        return points[0]
    return points[min(len(points) - 1, int(phase * POINTS + 1e-9))]  # a step's own time: its point
