"""The ``ssh`` kind: a peer reached over OpenSSH, whose agent books and runs the job on the peer's
own ledger and slice (docs/peers.md). Its settings are declared in ``dispatch.hosts.ssh.keys``."""

from __future__ import annotations

from collections.abc import Callable

from dispatch.core.errors import OverPeerCapError
from dispatch.core.units import format_size
from dispatch.hosts.base import RunExtras
from dispatch.hosts.machine import MachineHost
from dispatch.hosts.ssh.keys import SPEC, SSH, options_of

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.outcome import Outcome
    from dispatch.core.reportshape import MachineReport
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import HostSettings, Settings
    from dispatch.hosts.diagnosis import HostDiagnosis

    class PeerDiagnosis(HostDiagnosis, total=False):
        """A peer's doctor entry: its ssh destination, the agent's version, python and backend
        there, its config file, and a no-op's round trip through the warm connection."""

        ssh: Optional[str]
        agent_version: Optional[str]
        python: Optional[str]
        backend: Optional[str]
        config: Optional[str]
        round_trip_ms: float

SLOW_ROUND_TRIP = 0.08  # a no-op through a warm ControlMaster costs ~16 ms on these machines


class SshPeer(MachineHost):
    kind = SSH
    spec = SPEC

    def __init__(self, settings: Settings, table: HostSettings) -> None:
        super().__init__(settings, table)
        self.options = options_of(table)

    @classmethod
    def before_reading(cls, config: Settings) -> None:
        """Refuse an untrusted ControlMaster directory once, up front, before any ssh (exit 2)."""
        from dispatch.hosts.ssh.transport import control_dir, ensure_control_dir

        ensure_control_dir(control_dir(config.state_dir))

    def report(self, label: str | None = None, peaks: bool = False) -> MachineReport:
        from dispatch.hosts.ssh.peer import PeerClient

        return PeerClient(self.settings, self.table).report(label, timeout=self.settings.report_timeout,
                                                            peaks=peaks)

    def job_cap(self, cap: int | None, default_cap: int | None) -> int | None:
        """What its agent will run the job under: ``booking.peer_cap``, bounded by ``peer_memory_cap``."""
        from dispatch.local.admission.booking import peer_cap

        return peer_cap(cap, default_cap, self.options.peer_memory_cap)

    def cap_problem(self, limit: int | None) -> str | None:
        bound = self.options.peer_memory_cap
        if bound is None or limit is None or limit <= bound:
            return None
        return f"cap {format_size(limit)} exceeds its peer_memory_cap ({format_size(bound)})"

    def check_cap(self, cap: int | None) -> None:
        problem = self.cap_problem(self.job_cap(cap, self.table.default_cap))
        if problem is not None:
            raise OverPeerCapError(f"--peer={self.name}: {problem}")

    def run(self, request: RunRequest, say: Callable[[str], None], extras: RunExtras) -> Outcome:
        from dispatch.hosts.ssh.peerrun import PeerRun

        return PeerRun(self.settings, self.table, request, say, tree=extras.tree,
                       returns=extras.returns, forward_stdin=extras.stdin).run()

    def diagnose(self, reading: Any) -> PeerDiagnosis | None:
        """Can it be read, how long a no-op takes through the warm connection (a login shell that
        loads e.g. pyenv adds that to every command), and where its config and ours disagree."""
        import statistics

        from dispatch.core.errors import HostrunError
        from dispatch.hosts.ssh.transport import SshTransport

        entry: PeerDiagnosis = {"host": self.name, "ssh": self.options.ssh, "problems": [],
                                "title": f"peer {self.name} ({self.options.ssh})", "details": "",
                                "unread": "unreachable", "ok": reading.ok}
        if reading.report is None:
            entry["problems"].append(f"could not read: {reading.error}")
            return entry
        report = reading.report
        entry["agent_version"], entry["python"] = report.get("agent_version"), report.get("python")
        entry["backend"], entry["config"] = report.get("backend"), report.get("config")
        entry["details"] = (f", agent {entry['agent_version']} on python {entry['python']}, backend "
                            f"{entry['backend']}")
        if report.get("config_error"):
            entry["problems"].append(f"its config could not be read: {report['config_error']}")
        for d in report.get("disagreements", []):
            entry["problems"].append(f"{d['key']}: the peer's own config says {d['peer']}, ours says "
                                     f"{d['controller']} (the peer's value is used)")
        if report.get("backend") == "none":
            entry["problems"].append("no memory-cap backend works there: jobs would run uncapped")
        config = self.settings
        peer = SshTransport(self.table, config.state_dir, config.report_timeout, config.control_persist)
        try:
            times = [peer.run(["true"], timeout=config.report_timeout).elapsed for _ in range(3)]
        except HostrunError as exc:
            entry["problems"].append(str(exc))
            return entry
        entry["round_trip_ms"] = round(statistics.median(times) * 1000, 1)
        entry["details"] += f", {entry['round_trip_ms']} ms per command"
        if statistics.median(times) > SLOW_ROUND_TRIP:
            entry["problems"].append(
                f"every command there takes ~{entry['round_trip_ms']:.0f} ms through a warm connection "
                "(~16 ms is normal): its login shell probably does slow work on start (e.g. a "
                ".bashrc that loads pyenv); keep such set-up out of non-interactive shells")
        return entry


HOST = SshPeer  # what dispatch.hosts.kinds registers
