"""The readers behind ``hostrun top``: each configured host read again and again in a daemon thread
of its own, and this machine's history and alerts in one more, so the view draws whatever is
latest and never waits on a slow host (docs/cli.md, "hostrun top"). A read still unanswered past
``report_deadline`` is shown as such, with when the host last answered."""

from __future__ import annotations

import os
import threading
import time

from dispatch.core.errors import HostrunError
from dispatch.placement.reports import HostReading, read_host

MYPY = False
if MYPY:
    from typing import Optional

    from dispatch.core.alertshape import Alert
    from dispatch.core.settings import Settings
    from dispatch.hosts.base import Host
    from dispatch.local.store.ledgerdb import RunRecord

OUTCOMES = 20  # the history's latest runs a frame may show
ALERTS = 10  # the alerts a frame may show
ALERT_TAIL = 64 * 1024  # without a session, the recent alerts are read from the file's last bytes
NOT_READ = "not read yet"
STOP_WAIT = 2.0  # seconds ``stop`` waits for the history's reader to finish its read
RETRY = 5.0  # seconds between tries of a host that could not be read (each may cost an ssh login)


class HostWatch:
    """Every host's latest reading, refreshed every ``interval`` seconds in background threads."""

    def __init__(self, settings: Settings, interval: float, names: list[str] | None = None) -> None:
        from dispatch.hosts.kinds import hosts_of

        self.settings = settings
        self.interval = interval
        self.names = names  # None: every configured host
        self.hosts: list[Host] = hosts_of(settings, names)
        for kind in dict.fromkeys(type(h) for h in self.hosts):
            kind.before_reading(settings)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._latest = {h.name: HostReading(h.name, None, NOT_READ, 0.0, h) for h in self.hosts}
        self._read_at: dict[str, float] = {}
        self._asked: dict[str, Optional[float]] = {}
        self._runs: list[RunRecord] = []
        self._alerts: list[Alert] = []
        self._notes: list[str] = []
        self._here_read = False
        self._here_thread: threading.Thread | None = None
        self.session = os.environ.get("HOSTRUN_SESSION") or None

    def start(self) -> None:
        for host in self.hosts:
            threading.Thread(target=self._read_host, args=(host,), daemon=True,
                             name=f"top-{host.name}").start()
        self._here_thread = threading.Thread(target=self._read_here, daemon=True, name="top-history")
        self._here_thread.start()

    def stop(self) -> None:
        """Stop the readers; the history's reader is waited for (briefly), so that it is not cut
        by the interpreter's shutdown halfway through a read (a traceback on the user's terminal)."""
        self._stop.set()
        if self._here_thread is not None:
            self._here_thread.join(STOP_WAIT)

    def _read_host(self, host: Host) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with self._lock:
                self._asked[host.name] = started
            try:
                reading = read_host(host)
            except Exception as exc:  # a kind's bug must not end its thread unseen: say it instead
                reading = HostReading(host.name, None, f"{type(exc).__name__}: {exc}",
                                      time.monotonic() - started, host)
            with self._lock:
                self._latest[host.name] = reading
                self._asked[host.name] = None
                if reading.ok:
                    self._read_at[host.name] = time.time()
            pause = self.interval if reading.ok else max(self.interval, RETRY)
            self._stop.wait(max(0.0, pause - (time.monotonic() - started)))

    def _read_here(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                runs, alerts, notes = self.history_and_alerts()
            except Exception as exc:  # as in _read_host: said on the screen, the thread goes on
                runs, alerts, notes = self._runs, self._alerts, [f"history: {type(exc).__name__}: {exc}"]
            with self._lock:
                self._runs, self._alerts = runs, alerts
                self._notes = list(dict.fromkeys(self._notes + notes))[-3:]
                self._here_read = True
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def answered(self) -> bool:
        """Whether every host and this machine's history have been read at least once."""
        with self._lock:
            return self._here_read and all(r.error != NOT_READ for r in self._latest.values())

    def readings(self) -> tuple[list[HostReading], dict[str, float]]:
        """Each host's latest reading (one still unanswered past the deadline: that, as its
        error) and when each was last read successfully."""
        deadline = self.settings.report_deadline
        now = time.monotonic()
        with self._lock:
            found = []
            for host in self.hosts:
                asked = self._asked.get(host.name)
                if asked is not None and now - asked > deadline:
                    found.append(HostReading(host.name, None, f"no answer for {now - asked:.0f} s "
                                             f"(deadline {deadline:g} s)", now - asked, host))
                else:
                    found.append(self._latest[host.name])
            return found, dict(self._read_at)

    def here(self) -> tuple[list[RunRecord], list[Alert], list[str]]:
        """The latest history rows, alerts and notes read by the background thread."""
        with self._lock:
            return list(self._runs), list(self._alerts), list(self._notes)

    def alerts_title(self) -> str:
        return f"unread alerts for session {self.session}" if self.session else "recent alerts"

    def history_and_alerts(self) -> tuple[list[RunRecord], list[Alert], list[str]]:
        """This machine's latest runs and its alerts (the session's unread ones, left unread;
        without ``$HOSTRUN_SESSION``, the latest in the file), and what reading them said."""
        from dispatch.local.admission.ledger import Ledger
        from dispatch.local.hostslice import live_jobs_of

        notes: list[str] = []
        runs: list[RunRecord] = []
        try:
            ledger = Ledger(self.settings.state_dir, notes.append, live_jobs_of(self.settings))
            try:
                runs = ledger.runs(limit=OUTCOMES)
            finally:
                ledger.close()
        except (HostrunError, OSError) as exc:
            notes.append(f"history: {exc}")
        try:
            alerts = self._alerts_now()
        except (HostrunError, OSError) as exc:
            notes.append(f"alerts: {exc}")
            alerts = []
        return runs, alerts[-ALERTS:], notes

    def _alerts_now(self) -> list[Alert]:
        from dispatch.placement import alerts

        if self.session:
            return alerts.unread(self.settings, self.session, mark=False)
        try:
            with open(self.settings.alerts_path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, size - ALERT_TAIL))
                data = fh.read()
        except FileNotFoundError:
            return []
        if size > ALERT_TAIL:
            data = data[data.find(b"\n") + 1:]  # the first line is cut
        return alerts.parse_lines(data[:data.rfind(b"\n") + 1])
