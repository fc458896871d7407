"""The real Claude Code client, from the npm registry, for the real-client test tier.

``ensure_client()`` installs ``@anthropic-ai/claude-code`` at ``VERSION`` (pinned) once into
``~/.cache/hostrun-test-claude/VERSION`` with ``npm install --ignore-scripts``: the native binary
ships in the optional package ``@anthropic-ai/claude-code-linux-x64`` and runs without the
postinstall. Later runs reuse it. ``Claude`` runs it against a ``FakeMessagesAPI`` on loopback,
with a home of its own and the client's non-essential traffic off: nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

VERSION = "2.1.197"
CACHE = Path(os.environ.get("HOSTRUN_TEST_CLAUDE_CACHE") or Path.home() / ".cache" / "hostrun-test-claude")


class ClientUnavailable(Exception):
    """Why the client cannot be had here (no npm, no registry): the tier's not-run reason."""


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "x64", "aarch64": "arm64"}.get(machine, machine)


def ensure_client() -> Path:
    """The client's native binary, installed from the npm registry on first use."""
    prefix = CACHE / VERSION
    binary = prefix / "node_modules" / "@anthropic-ai" / f"claude-code-linux-{_arch()}" / "claude"
    if binary.is_file() and (prefix / "ready").exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise ClientUnavailable("the real Claude Code client: npm is not installed")
    prefix.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([npm, "install", "--no-save", "--ignore-scripts", "--no-audit", "--no-fund",
                               "--prefix", str(prefix), f"@anthropic-ai/claude-code@{VERSION}"],
                              capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise ClientUnavailable("the real Claude Code client: npm install timed out") from None
    if done.returncode != 0 or not binary.is_file():
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ClientUnavailable(f"the real Claude Code client: npm install failed: {said[0]}")
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                             check=False)
    if VERSION not in version.stdout:
        raise ClientUnavailable(f"the real Claude Code client: {binary} --version said {version.stdout!r}")
    (prefix / "ready").write_text(VERSION + "\n")
    return binary


class Claude:
    """The client with a home of its own (``home``), talking only to ``api_url``."""

    def __init__(self, binary: Path, home: Path, api_url: str) -> None:
        self.binary = binary
        self.home = home
        self.api_url = api_url
        self.ended: float | None = None  # when the last print_mode run had ended (time.monotonic)
        home.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CLAUDE", "ANTHROPIC", "HOSTRUN_")) and k != "CI"}
        env.update(HOME=str(self.home), ANTHROPIC_BASE_URL=self.api_url, ANTHROPIC_API_KEY="sk-fake-test",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1",
                   XDG_CACHE_HOME=str(self.home / ".cache"), XDG_CONFIG_HOME=str(self.home / ".config"))
        env.update(extra)
        return env

    def print_mode(self, prompt: str, cwd: Path, *options: str, timeout: float = 120,
                   env: dict[str, str] | None = None
                   ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        """``claude -p PROMPT --output-format json``: the process and its result object ({} when
        it printed none). ``timeout`` is a hang detector, far above a run's few seconds."""
        proc = subprocess.run([str(self.binary), "-p", prompt, "--output-format", "json", *options],
                              cwd=cwd, env=env or self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        self.ended = time.monotonic()  # exited, and its output closed (a child holding it holds this)
        try:
            result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
        except ValueError:
            result = {}
        return proc, result


class Terminal:
    """The client's terminal UI in a tmux session of its own (``send``, ``screen``), started in
    ``cwd`` with onboarding done and ``cwd`` trusted in its home's ``.claude.json``, as a user who
    has used it before would have."""

    def __init__(self, claude: Claude, cwd: Path, name: str, **env: str) -> None:
        import shlex

        self.name = name
        state = {"hasCompletedOnboarding": True, "theme": "dark",
                 "customApiKeyResponses": {"approved": ["sk-fake-test"], "rejected": []},
                 "projects": {str(cwd): {"hasTrustDialogAccepted": True,
                                         "hasCompletedProjectOnboarding": True}}}
        (claude.home / ".claude.json").write_text(json.dumps(state))
        words = ["env", *(f"{k}={v}" for k, v in claude.env(**env).items()), str(claude.binary)]
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "50", "-c", str(cwd),
                        " ".join(shlex.quote(w) for w in words)], check=True, timeout=30)
        self.pid = int(self._tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name)

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True, timeout=30,
                       check=False)
