"""The peak journal: every recorded run as one plain-text line in the state dir, next to the ledger.

The peak table is the one part of the ledger that cannot be rebuilt from the running system, so each
run is also appended here (inside the ledger's write lock, before its commit). When the ledger is
damaged, ``dispatch.local.store.recovery`` replays this file into a fresh one. Lines, tab-separated, ``-`` for
NULL, label and host with backslash, tab and newline escaped::

    R  at label host peak cap hit duration event clear_after [vram [ramp]]   a run: folded into
                                                                             peaks, peak_runs
    P  label host max_peak runs last_peak hit last_duration max_duration updated
       ceiling_at slice_full_at clean_runs [max_vram [ramp min_duration]]
    H  at label host peak cap hit duration            a run already counted in a P line

``event`` and ``clear_after`` (what the run did to its label's mark, or ``f``: that it failed, and the
``clear_mark_after`` then in force) are written with the run, so a replay sets and clears marks, and
leaves a failed run's peak out of an unset booking peak, as the ledger did; ``vram`` only
for a run whose VRAM was measured (``-`` before a ramp otherwise); ``ramp`` (its ramp profile, ten
comma-separated byte counts, ``dispatch.local.store.ramp``) only for a run that recorded one. Lines
written before marks, VRAM or ramps existed (R and P without the last fields) are still read: no
event, no mark, no VRAM, no ramp.

Past ``COMPACT_AT`` bytes the journal is rewritten as a snapshot of the ledger (P and H lines),
atomically, in the same write lock. Standard library only (shipped to peers with the ledger).
"""

from __future__ import annotations

import os

from dispatch.core.atomicfile import write_atomic
from dispatch.local.store.ledgerdb import CLEAR_MARK_AFTER, NO_EVENT
from dispatch.local.store.ramp import decode as decode_ramp
from dispatch.local.store.ramp import encode as encode_ramp

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence
    from typing import Optional

    from dispatch.local.store.ledgerdb import PeakRecord, PeakRun

HEADER = "# hostrun peak journal 1\n"
COMPACT_AT = 256 << 10  # bytes; then compacted once it is also twice the size of a snapshot
LINE_GUESS = 96  # bytes per snapshot line, to tell whether compacting would pay


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _unesc(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            i += 1
            c = {"t": "\t", "n": "\n"}.get(text[i], text[i])
        out.append(c)
        i += 1
    return "".join(out)


def _num(value: float | int | None) -> str:
    return "-" if value is None else repr(value)


def _float(text: str) -> float | None:
    return None if text == "-" else float(text)


def _int(text: str) -> int | None:
    return None if text == "-" else int(text)


def run_line(label: str, host: str, peak: int, cap: int | None, hit: bool, duration: float | None,
             at: float, kind: str = "R", event: str = NO_EVENT,
             clear_after: int = CLEAR_MARK_AFTER, vram: int | None = None,
             ramp: Sequence[int] | None = None) -> str:
    fields = [kind, repr(at), _esc(label), _esc(host), str(peak), _num(cap), str(int(hit)),
              _num(duration)]
    if kind == "R":
        fields += [event, str(clear_after)]
        if vram is not None or ramp is not None:
            fields.append(_num(vram))
        if ramp is not None:
            fields.append(encode_ramp(ramp) or "-")
    return "\t".join(fields) + "\n"


def peak_line(p: PeakRecord) -> str:
    fields = ["P", _esc(p.label), _esc(p.host), str(p.max_peak), str(p.runs), str(p.last_peak),
              str(int(p.hit_ceiling)), _num(p.last_duration), _num(p.max_duration), repr(p.updated),
              _num(p.ceiling_at), _num(p.slice_full_at), str(p.clean_runs)]
    if p.max_vram is not None or p.ramp is not None:
        fields.append(_num(p.max_vram))
    if p.ramp is not None:
        fields += [encode_ramp(p.ramp) or "-", _num(p.min_duration)]
    return "\t".join(fields) + "\n"


def append(path: str, line: str) -> int:
    """Append one line (one write, O_APPEND: whole lines even with several writers); the new size."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def wants_compaction(size: int, lines_in_snapshot: int) -> bool:
    return size > COMPACT_AT and size > 2 * LINE_GUESS * lines_in_snapshot


def write_snapshot(path: str, peaks: Sequence[PeakRecord], runs: Sequence[PeakRun]) -> None:
    """Replace the journal by the ledger's peak table and history (private, atomically)."""
    text = [HEADER, *(peak_line(p) for p in peaks)]
    text += [run_line(r.label, r.host, r.peak, r.cap, r.hit_ceiling, r.duration, r.at, "H")
             for r in runs]
    write_atomic(path, "".join(text).encode(), 0o600, fsync=True)


def replay(path: str,
           fold: Callable[[str, str, int, bool, float | None, int | None, float, str, int,
                           int | None, Optional[tuple[int, ...]]], object],
           put_peak: Callable[[tuple[object, ...]], object],
           put_run: Callable[[str, str, int, bool, float | None, int | None, float], object],
           ) -> tuple[int, int]:
    """Feed each line to the ledger: R to ``fold``, P to ``put_peak`` (all fifteen peaks columns),
    H to ``put_run``.

    Returns (lines used, lines skipped): a torn last line or a damaged one is skipped, not fatal.
    """
    used = skipped = 0
    try:
        with open(path, "rb") as fh:
            data = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return 0, 0
    for line in data.split("\n"):
        if not line or line.startswith("#"):
            continue
        f = line.split("\t")
        try:
            if (f[0], len(f)) in (("R", 8), ("R", 10), ("R", 11), ("R", 12), ("H", 8)):
                args = (_unesc(f[2]), _unesc(f[3]), int(f[4]), f[6] == "1", _float(f[7]), _int(f[5]),
                        float(f[1]))
                if f[0] == "H":
                    put_run(*args)
                elif len(f) >= 10:
                    fold(*args, f[8], max(1, int(f[9])), _int(f[10]) if len(f) >= 11 else None,
                         decode_ramp(f[11]) if len(f) == 12 else None)
                else:
                    fold(*args, NO_EVENT, CLEAR_MARK_AFTER, None, None)
            elif f[0] == "P" and len(f) in (10, 13, 14, 16):
                marks = (_float(f[10]), _float(f[11]), int(f[12])) if len(f) >= 13 else (None, None, 0)
                vram = _int(f[13]) if len(f) >= 14 else None
                ramp = ((encode_ramp(decode_ramp(f[14])), _float(f[15])) if len(f) == 16
                        else (None, None))
                put_peak((_unesc(f[1]), _unesc(f[2]), int(f[3]), int(f[4]), int(f[5]), int(f[6]),
                          _float(f[7]), _float(f[8]), float(f[9]), *marks, vram, *ramp))
            else:
                raise ValueError(line)
        except ValueError:
            skipped += 1
            continue
        used += 1
    return used, skipped
