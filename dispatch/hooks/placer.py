"""The SessionStart hook's placing of a running agent session (``dispatch.local.sessions.sessionplace``): the
detached process it starts (``start``) and what that process runs (``main``, ``python -m
dispatch.hooks.placer PID LABEL [--config PATH]``), which logs to ``state_dir/sessions.log``."""

from __future__ import annotations

import os
import sys
import time

from dispatch.core.errors import HostrunError
from dispatch.core.exitcodes import ExitCode


def start(config: str | None, pid: int, label: str) -> None:
    """Start the placing process for agent ``pid``, detached (its own session, no terminal, no
    output), and return at once: the hook does not wait for it."""
    import subprocess

    argv = [sys.executable, "-m", "dispatch.hooks.placer", str(pid), label]
    if config:
        argv += ["--config", config]
    subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def main(argv: list[str]) -> int:
    pid, label = int(argv[0]), argv[1]
    config = argv[3] if argv[2:3] == ["--config"] else None
    from dispatch.config import load_settings
    from dispatch.local.sessions.sessionplace import place

    settings = load_settings(config)
    log = os.path.join(settings.state_dir, "sessions.log")

    def say(line: str) -> None:
        from dispatch.core.text import printable

        try:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {printable(line)}\n".encode())
            finally:
                os.close(fd)
        except OSError:
            pass

    try:
        return place(settings, pid, label, say)
    except (HostrunError, OSError) as exc:
        say(f"could not place the session of pid {pid}: {exc}")
        return int(ExitCode.NOT_RUN)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
