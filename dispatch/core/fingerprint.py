"""sha256 without ``import hashlib`` (which loads OpenSSL: ~2-3 ms on every hostrun call)."""

from __future__ import annotations

MYPY = False
if MYPY:
    from typing import Any


sha256: Any
try:
    from _sha2 import sha256  # type: ignore[import-not-found,no-redef]  # Python >= 3.12
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef]  # Python <= 3.11
    except ImportError:
        from hashlib import sha256


def short_hash(data: bytes, length: int = 10) -> str:
    return str(sha256(data).hexdigest()[:length])
