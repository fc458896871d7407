"""What a waiting run's status figures also go to: one alert once it has waited
``alert_wait_after`` (``dispatch.local.alertlog.WaitAlert``), and the peer watch (a peer that could
take it now). ``due`` says whether it wants the figures at all yet, so a run that waits a short while
never builds them, nor imports the alert code: most runs never wait that long, and what a waiting
run has imported is what it holds while it waits."""

from __future__ import annotations

import time

MYPY = False
if MYPY:
    from collections.abc import Callable

    from dispatch.core.alertshape import WaitFigures
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import Settings
    from dispatch.local.admission.policy import Admission


class WaitWatch:
    """Called with each status's ``Admission``; chains to ``then`` (the peer watch)."""

    def __init__(self, settings: Settings, host: str, label: str, request: RunRequest,
                 say: Callable[[str], None], then: Callable[[Admission], None] | None,
                 deliver: Callable[[WaitFigures], None] | None, alert_after: float,
                 started: float | None = None) -> None:
        self.settings, self.host, self.label, self.request, self.say = settings, host, label, request, say
        self.then, self.deliver, self.alert_after = then, deliver, alert_after
        self.started = time.monotonic() if started is None else started
        self.alert: Callable[[Admission], None] | None = None

    def _alert_due(self) -> bool:
        return self.alert_after > 0 and time.monotonic() - self.started >= self.alert_after

    def due(self) -> bool:
        return self.then is not None or self.alert is not None or self._alert_due()

    def __call__(self, adm: Admission) -> None:
        if self.alert is None and self._alert_due():
            from dispatch.local.alertlog import WaitAlert

            request = self.request
            self.alert = WaitAlert(self.settings.alerts_path, self.alert_after, self.host, self.label,
                                   request.session, request.argv, self.say, self.then,
                                   started=self.started, deliver=self.deliver)
        if self.alert is not None:
            self.alert(adm)
        elif self.then is not None:
            self.then(adm)


def watch_for(settings: Settings, host: str, label: str, request: RunRequest, say: Callable[[str], None],
              on_wait: Callable[[Admission], None] | None, alerts: bool,
              wait_alert: Callable[[WaitFigures], None] | None,
              started: float | None = None) -> WaitWatch | None:
    """The wait's watch: with ``alerts`` (or ``wait_alert``, a peer's agent handing the figures to
    its controller) and ``alert_wait_after`` > 0, a long wait alerts once; ``on_wait`` (the peer
    watch) gets every status. None when neither applies. ``started``: when the wait began (a run
    resumed after waiting parked)."""
    after = settings.alert_wait_after if (alerts or wait_alert is not None) else 0.0
    if after <= 0 and on_wait is None:
        return None
    return WaitWatch(settings, host, label, request, say, on_wait, wait_alert, max(0.0, after), started)
