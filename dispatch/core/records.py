"""``NamedTuple`` for our records, without importing ``typing`` on the hot path.

mypy sees ``typing.NamedTuple`` (it treats ``MYPY`` as true). At run time the same class syntax builds
a tuple class that behaves as a ``collections.namedtuple`` (tests/fast/test_records.py holds them side by
side): importing ``typing`` (which pulls in ``re``) costs every ``hostrun`` call several milliseconds,
dataclasses compile their methods with ``exec``, and ``collections.namedtuple`` ``eval``s a
``__new__`` for each class (~0.1 ms each, ~20 classes a run). Every module that defines a record
uses ``from __future__ import annotations``, so field types are never evaluated.
"""

from __future__ import annotations

MYPY = False
if MYPY:
    from typing import NamedTuple as NamedTuple
else:
    try:
        from _collections import _tuplegetter  # what collections.namedtuple's fields are
    except ImportError:  # pragma: no cover - another Python
        from _operator import itemgetter

        def _tuplegetter(index, doc):  # type: ignore[no-untyped-def]
            return property(itemgetter(index), doc=doc)

    _SKIP = {"__module__", "__qualname__", "__annotations__", "__orig_bases__", "__dict__",
             "__weakref__", "__classcell__", "__static_attributes__", "__firstlineno__"}
    _tuple_new = tuple.__new__

    def _arguments(cls, args, kwargs):  # type: ignore[no-untyped-def]
        """The values of a call with keywords, defaults or a wrong count, as Python checks them."""
        fields, defaults = cls._fields, cls._field_defaults
        where = f"{cls.__name__}.__new__()"
        if len(args) > len(fields):
            required = len(fields) - len(defaults) + 1
            takes = f"from {required} to " if defaults else ""
            raise TypeError(f"{where} takes {takes}{len(fields) + 1} positional arguments but "
                            f"{len(args) + 1} were given")
        for name in fields[:len(args)]:
            if name in kwargs:
                raise TypeError(f"{where} got multiple values for argument {name!r}")
        values, missing = list(args), []
        for name in fields[len(args):]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in defaults:
                values.append(defaults[name])
            else:
                missing.append(name)
        if kwargs:
            raise TypeError(f"{where} got an unexpected keyword argument {next(iter(kwargs))!r}")
        if missing:
            quoted = [repr(m) for m in missing]
            names = (" and ".join(quoted) if len(quoted) < 3
                     else ", ".join(quoted[:-1]) + ", and " + quoted[-1])
            plural = "s" if len(missing) > 1 else ""
            raise TypeError(f"{where} missing {len(missing)} required positional argument{plural}: {names}")
        return values

    def _record(name, fields, defaults, ns):  # type: ignore[no-untyped-def]
        """A tuple class with collections.namedtuple's behaviour (its methods, repr, errors), built
        without its ``eval`` of a generated ``__new__``: ~5x cheaper per class, and hostrun defines
        ~20 on every call."""
        count = len(fields)

        def __new__(_cls, *args, **kwargs):  # type: ignore[no-untyped-def]
            if not kwargs and len(args) == count:
                return _tuple_new(_cls, args)
            return _tuple_new(_cls, _arguments(_cls, args, kwargs))

        def _make(cls, iterable):  # type: ignore[no-untyped-def]
            result = _tuple_new(cls, iterable)
            if len(result) != count:
                raise TypeError(f"Expected {count} arguments, got {len(result)}")
            return result

        def _replace(self, /, **kwds):  # type: ignore[no-untyped-def]
            result = self._make(map(kwds.pop, fields, self))
            if kwds:
                raise ValueError(f"Got unexpected field names: {list(kwds)!r}")
            return result

        def __repr__(self):  # type: ignore[no-untyped-def]
            return f"{self.__class__.__name__}(" + ", ".join(
                f"{field}={value!r}" for field, value in zip(fields, self)) + ")"

        def _asdict(self):  # type: ignore[no-untyped-def]
            return dict(zip(fields, self))

        def __getnewargs__(self):  # type: ignore[no-untyped-def]
            return tuple(self)

        body = {
            "__doc__": f"{name}({', '.join(fields)})", "__slots__": (), "_fields": fields,
            "_field_defaults": dict(zip(fields[count - len(defaults):], defaults)),
            "__new__": __new__, "_make": classmethod(_make), "_replace": _replace,
            "__repr__": __repr__, "_asdict": _asdict, "__getnewargs__": __getnewargs__,
            "__match_args__": fields, "__module__": ns["__module__"],
        }
        for index, field in enumerate(fields):
            body[field] = _tuplegetter(index, f"Alias for field number {index}")
        for key, value in ns.items():
            if key not in _SKIP and key not in fields:
                body[key] = value
        record = type(name, (tuple,), body)
        record.__qualname__ = ns.get("__qualname__", name)
        return record

    class _RecordMeta(type):
        def __new__(mcls, name, bases, ns):  # type: ignore[no-untyped-def]
            if ns.get("_root", False):
                return super().__new__(mcls, name, bases, ns)
            fields = tuple(ns.get("__annotations__", {}))
            if not fields and "__annotate__" in ns:  # pragma: no cover - Python 3.14 without PEP 563
                from typing import NamedTuple as _TypingNamedTuple

                return type(_TypingNamedTuple)(name, (_TypingNamedTuple,), ns)
            defaults = [ns[f] for f in fields if f in ns]
            return _record(name, fields, defaults, ns)

    class NamedTuple(metaclass=_RecordMeta):
        _root = True
