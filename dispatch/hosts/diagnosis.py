"""The declared shape of ``hostrun doctor``'s entry for a host that is not this machine
(``Host.diagnose``): what every kind says, which ``hostrun doctor`` renders; a kind adds its own
fields in its package (``ssh/kind.py``'s ``PeerDiagnosis``, ``slurm/kind.py``'s
``ClusterDiagnosis``), shown by ``--json``.

Type-checking only: imported under ``if MYPY:`` (``hosts.base`` is on every run's path).
"""

from __future__ import annotations

from typing import TypedDict


class HostDiagnosis(TypedDict):
    host: str
    ok: bool  # its report could be read
    problems: list[str]
    title: str  # how doctor names it ("peer p1 (user@p1)", "cluster c1, partition x")
    details: str  # what it found, when it could read it (", agent 0.1.0 on python 3.11, ...")
    unread: str  # the word for a host it could not read ("unreachable", "could not read")
