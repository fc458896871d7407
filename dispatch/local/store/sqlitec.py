"""The ``sqlite3`` the ledger uses: the C module ``_sqlite3`` alone where it exists. The ``sqlite3``
package adds datetime adapters hostrun never uses, and their imports (``datetime``: ~2.5 ms of
every process that opens the ledger); the classes are the same."""

from __future__ import annotations

__all__ = ["sqlite3"]

MYPY = False
if MYPY:
    import sqlite3
else:
    try:
        import _sqlite3 as sqlite3
    except ImportError:
        import sqlite3
