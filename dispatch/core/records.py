"""``NamedTuple`` for our records, without importing ``typing`` on the hot path.

mypy sees ``typing.NamedTuple`` (it treats ``MYPY`` as true). At run time the same class syntax builds
a ``collections.namedtuple``: importing ``typing`` (which pulls in ``re``) costs every ``hostrun``
call several milliseconds, and dataclasses compile their methods with ``exec``. Every module that
defines a record uses ``from __future__ import annotations``, so field types are never evaluated.
"""

from __future__ import annotations

MYPY = False
if MYPY:
    from typing import NamedTuple as NamedTuple
else:
    import collections

    _SKIP = {"__module__", "__qualname__", "__annotations__", "__orig_bases__", "__dict__",
             "__weakref__", "__classcell__", "__static_attributes__", "__firstlineno__"}

    class _RecordMeta(type):
        def __new__(mcls, name, bases, ns):  # type: ignore[no-untyped-def]
            if ns.get("_root", False):
                return super().__new__(mcls, name, bases, ns)
            fields = list(ns.get("__annotations__", {}))
            if not fields and "__annotate__" in ns:  # pragma: no cover - Python 3.14 without PEP 563
                from typing import NamedTuple as _TypingNamedTuple

                return type(_TypingNamedTuple)(name, (_TypingNamedTuple,), ns)
            defaults = [ns[f] for f in fields if f in ns]
            record = collections.namedtuple(name, fields, defaults=defaults, module=ns["__module__"])
            record.__qualname__ = ns.get("__qualname__", name)
            for key, value in ns.items():
                if key not in _SKIP and key not in fields:
                    setattr(record, key, value)
            return record

    class NamedTuple(metaclass=_RecordMeta):
        _root = True
