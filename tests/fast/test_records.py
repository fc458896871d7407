"""``dispatch.core.records.NamedTuple`` at run time is a tuple class built by hand (no
``collections.namedtuple``, whose ``eval`` costs every hostrun call ~2 ms over ~20 records): here it
is held against ``collections.namedtuple`` call for call, errors included."""

from __future__ import annotations

import collections
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from dispatch.core.records import NamedTuple
from dispatch.local.store.ledgerdb import Booking


class Point(NamedTuple):
    """A point."""

    x: int
    y: int
    label: str = "p"
    weight: float = 1.0

    def norm(self) -> int:
        return abs(self.x) + abs(self.y)

    @property
    def flipped(self) -> Point:
        return self._replace(x=self.y, y=self.x)


class Two(NamedTuple):
    a: int
    b: int
    c: int


Reference = collections.namedtuple("Point", ["x", "y", "label", "weight"], defaults=["p", 1.0])
ReferenceTwo = collections.namedtuple("Two", ["a", "b", "c"])


def outcome(call: Callable[[], Any]) -> tuple[str, str]:
    try:
        return "ok", repr(call())
    except Exception as exc:  # the error's type and words are part of the behaviour
        return type(exc).__name__, str(exc)


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1, 2), {}), ((1, 2, "q"), {}), ((1, 2, "q", 3.0), {}), ((), {"x": 1, "y": 2}),
    ((1,), {"y": 2, "weight": 0.5}), ((), {}), ((1,), {}), ((1, 2, "q", 3.0, 4), {}),
    ((1,), {"x": 2}), ((1, 2), {"z": 3}), ((), {"y": 1}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_construction_is_namedtuples(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert outcome(lambda: Point(*args, **kwargs)) == outcome(lambda: Reference(*args, **kwargs))


def test_three_missing_arguments_read_as_python_says_them() -> None:
    assert outcome(lambda: Two()) == outcome(lambda: ReferenceTwo())  # type: ignore[call-arg]
    assert outcome(lambda: Two(1)) == outcome(lambda: ReferenceTwo(1))  # type: ignore[call-arg]


def test_the_methods_are_namedtuples() -> None:
    p, r = Point(1, -2), Reference(1, -2)
    assert p == r and tuple(p) == tuple(r) and hash(p) == hash(r)
    assert repr(p) == repr(r) == "Point(x=1, y=-2, label='p', weight=1.0)"
    assert p._fields == r._fields and Point._field_defaults == Reference._field_defaults
    assert p._asdict() == r._asdict() and type(p._asdict()) is dict
    assert repr(p._replace(label="z")) == repr(r._replace(label="z"))
    assert outcome(lambda: p._replace(nope=1)) == outcome(lambda: r._replace(nope=1))
    assert repr(Point._make([3, 4, "m", 2.0])) == repr(Reference._make([3, 4, "m", 2.0]))
    assert outcome(lambda: Point._make([3])) == outcome(lambda: Reference._make([3]))
    assert p.__getnewargs__() == r.__getnewargs__()
    assert Point.__match_args__ == Reference.__match_args__
    assert pickle.loads(pickle.dumps(p)) == p and type(pickle.loads(pickle.dumps(p))) is Point
    with pytest.raises(AttributeError):
        p.x = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.other = 5  # type: ignore[attr-defined]  # __slots__ = (): no instance dict


def test_the_class_body_is_kept() -> None:
    p = Point(3, -4)
    assert p.norm() == 7 and p.flipped == Point(-4, 3)
    assert Point.__doc__ == "A point."
    assert Point.__qualname__ == "Point" and Point.__module__ == __name__
    assert Point.x.__doc__ == Reference.x.__doc__  # type: ignore[attr-defined]


def test_a_real_record() -> None:
    """One of the ledger's own records, as its readers build it (positionally) and replace it."""
    fields = Booking._fields
    row = Booking(*range(len(fields)))
    assert row._replace(**{fields[0]: "x"})[0] == "x"
    assert list(row._asdict()) == list(fields)
