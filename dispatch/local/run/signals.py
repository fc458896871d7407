"""The signals hostrun passes on to a job it runs (here, on a peer, or on a cluster), collected while
the job runs and acted on by the caller's loop (standard library only)."""

from __future__ import annotations

MYPY = False
if MYPY:
    import signal
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class ForwardedSignals:
    """While the job runs: collect forwarded signals; restore the old handlers afterwards."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._old: dict[int, object] = {}

    def __enter__(self) -> ForwardedSignals:
        for sig in FORWARDED:
            self._old[sig] = signal.signal(sig, lambda signum, _frame: self.pending.append(signum))
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
