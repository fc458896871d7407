"""The fixtures of the real-client tier (tests/client/test_claude_*.py): the pinned client, a fake Messages
API per test, the client with a home of its own, and a checkout with hostrun's hooks installed.
A test module imports the fixtures it uses by name."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ON_CI, Hostrun
from tests.support.claudeapi import FakeMessagesAPI
from tests.support.claudeclient import Claude, ClientUnavailable, ensure_client

MODES = ("remind", "wrap", "guard")
# How long ``claude -p`` may take to end after the model's last answer (the client then runs its Stop
# hooks, background ones included, before it prints its result). Hooks that wait on something (the
# rewake waiter, up to 55 min) must not run headless; the rest take well under a second each.
ENDS_WITHIN_S = 5.0


def seconds_to_end(claude: Claude, api: FakeMessagesAPI) -> float:
    """How long the last ``claude.print_mode`` took to end after the fake API's last answer."""
    assert claude.ended is not None and api.last_answer is not None, "no print-mode run answered"
    return claude.ended - api.last_answer


@pytest.fixture(scope="session")
def client_binary() -> Path:
    try:
        return ensure_client()
    except ClientUnavailable as exc:
        if ON_CI:
            pytest.fail(f"CI=true but {exc}")
        pytest.skip(str(exc))  # only off CI


@pytest.fixture
def api() -> Iterator[FakeMessagesAPI]:
    server = FakeMessagesAPI().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def claude(client_binary: Path, api: FakeMessagesAPI, tmp_path: Path) -> Claude:
    return Claude(client_binary, tmp_path / "client-home", api.url)


def project(hostrun: Hostrun, tmp_path: Path, mode: str, settings: str | None = None) -> Path:
    """A git checkout with hostrun's hooks installed in its ``.claude/settings.json`` (holding
    ``settings`` before the install, when given)."""
    tree = tmp_path / "project"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    if settings is not None:
        (tree / ".claude").mkdir()
        (tree / ".claude" / "settings.json").write_text(settings)
    hostrun.configure(slice="1G")
    done = hostrun.run("agents", "install", "claude-code", "--mode", mode, cwd=tree)
    assert done.returncode == 0, done.stderr
    assert "hook rewake" in (tree / ".claude" / "settings.json").read_text()
    return tree
