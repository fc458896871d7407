"""Driving ``PeerRun`` phase by phase against the fake peer (tests/support/fakepeer.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from dispatch.core.configfile import make_host
from dispatch.core.outcome import Outcome
from dispatch.core.request import RunRequest
from dispatch.core.settings import LOCAL, HostSettings, Settings
from dispatch.hosts.ssh.keys import SPEC as SSH_KIND
from dispatch.hosts.ssh.peerrun import PeerRun
from dispatch.hosts.ssh.remotetree import tree_id
from tests.support.fakepeer import HOST_SSH, FakeLink, Script

PROBE = "echo faketool 1.0"  # the toolchain probe, run on this host by the controller
ARGV = ["make", "all"]


class Driver:
    """One ``PeerRun`` against one ``FakeLink``, and what it said."""

    def __init__(self, tmp: Path, tree: Path, script: Script, returns: Sequence[str] = (),
                 on_line: Callable[[Driver, str], None] | None = None) -> None:
        self.lines: list[str] = []
        self.on_line = on_line
        self.link = FakeLink(tmp / "fake", script)
        state = tmp / "state"
        state.mkdir(mode=0o700, exist_ok=True)
        self.host = make_host("fake", SSH_KIND, ssh=HOST_SSH)
        settings = Settings(state_dir=str(state), hosts={LOCAL: HostSettings(LOCAL), "fake": self.host},
                            toolchain_probes=(PROBE,))
        self.run = PeerRun(settings, self.host, RunRequest(argv=ARGV, label="build"), self.say,
                           tree=str(tree), returns=returns, link=self.link)
        self.peer_tree = self.link.peer_root / tree_id(str(tree))

    def say(self, line: str) -> None:
        self.lines.append(line)
        if self.on_line is not None:
            self.on_line(self, line)

    def __call__(self) -> Outcome:
        return self.run.run()


def source_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A source tree; the job runs in its ``sub`` directory (the current directory from here)."""
    top = tmp_path / "tree"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "main.c").write_text("int main(void) { return 0; }\n")
    monkeypatch.chdir(top / "sub")
    return top
