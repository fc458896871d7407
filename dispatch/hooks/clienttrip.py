"""One real ``claude -p`` round trip for ``hostrun agents status``: the self-test feeds events to the
hooks itself, which cannot show that the client accepts the settings file and runs what it names.

The client is asked for one word with no tools (``--tools ""``, no session saved), with its hook
events in the output (``--include-hook-events``). It passes when the client ran hostrun's
SessionStart hook (its answer names hostrun), every hook it ran succeeded, and the run ended with
its result: headless the rewake waiter must exit at once, or ``-p`` would hang. It costs one request
to the model the user's client is set up for (``haiku`` unless told otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any

PROMPT = "This is a connectivity check by hostrun. Reply with the single word: ok"
TIMEOUT = 90.0


def find_client() -> str | None:
    """The ``claude`` on PATH, where there is one."""
    return shutil.which("claude")


def round_trip(client: str, cwd: str, model: str = "haiku", timeout: float = TIMEOUT) -> dict[str, Any]:
    """Run the client once in ``cwd``: ``ok`` (None: the hooks worked but the client's own request
    failed), ``problem`` (why not), the ``hooks`` it ran (event, outcome, exit code), ``seconds``
    and the client's ``version``."""
    found: dict[str, Any] = {"client": client, "cwd": cwd, "model": model, "ok": False, "problem": None,
                             "hooks": [], "seconds": None, "version": _version(client)}
    env = {**os.environ, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    argv = [client, "-p", PROMPT, "--output-format", "stream-json", "--verbose", "--include-hook-events",
            "--tools", "", "--no-session-persistence", "--model", model]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        found["problem"] = (f"claude -p did not finish within {timeout:g} s (a Stop hook that waits "
                            "holds every headless run)")
        return found
    except OSError as exc:
        found["problem"] = f"could not start {client}: {exc.strerror or exc}"
        return found
    found["seconds"] = round(time.monotonic() - started, 1)
    events = _events(done.stdout)
    found["hooks"] = [{"event": e.get("hook_event"), "name": e.get("hook_name"), "outcome": e.get("outcome"),
                       "exit_code": e.get("exit_code"), "stderr": str(e.get("stderr") or "")[-300:]}
                      for e in events if e.get("subtype") == "hook_response"]
    found["problem"] = _problem(done, events, found["hooks"])
    found["ok"] = found["problem"] is None
    request = _request_failure(events)
    if found["ok"] and request:
        found.update(ok=None, problem=request)  # the hooks worked; the client's request did not
    return found


def _problem(done: subprocess.CompletedProcess[str], events: list[dict[str, Any]],
             hooks: list[dict[str, Any]]) -> str | None:
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    if result is None:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"claude -p printed no result (exit {done.returncode}): {said[0]}"
    failed = [h for h in hooks if h["outcome"] != "success" or h["exit_code"] not in (0, None)]
    if failed:
        first = failed[0]
        return (f"the client's {first['name']} hook failed (exit {first['exit_code']}): "
                f"{first['stderr'].strip() or first['outcome']}")
    started = [e for e in events if e.get("subtype") == "hook_response"
               and e.get("hook_event") == "SessionStart" and "hostrun" in str(e.get("output") or "")]
    if not started:
        return ("the client did not run hostrun's SessionStart hook: it did not read the installed "
                "settings here, or rejected them (run claude here and look for a settings error)")
    return None


def _request_failure(events: list[dict[str, Any]]) -> str | None:
    """The client's own failure (not logged in, no network, a model it may not use): not the hooks'."""
    result: dict[str, Any] = next((e for e in reversed(events) if e.get("type") == "result"), {})
    if not result.get("is_error"):
        return None
    return f"the client's request failed: {str(result.get('result') or result.get('subtype'))[:200]}"


def _events(stdout: str) -> list[dict[str, Any]]:
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _version(client: str) -> str | None:
    try:
        done = subprocess.run([client, "--version"], capture_output=True, text=True, timeout=30, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().split(" ")[0] or None
