"""Claude Code's hook events as recorded (tests/recorded/claude, written from the published hooks
reference), and running the real ``hostrun hook`` on one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.conftest import Hostrun

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "claude"


ROOT = Path(__file__).resolve().parents[2]


def event(name: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    command = changes.pop("command", None)
    if command is not None:
        data["tool_input"] = {**data["tool_input"], "command": command}
    data.update(changes)
    return data


# -------------------------------------------------------------------- with a real ledger and jobs
def real_hook(hostrun: Hostrun, data: dict[str, Any], *argv: str,
              env: dict[str, str] | None = None) -> dict[str, Any] | None:
    proc = hostrun.run("hook", *argv, input=json.dumps(data), env={**os.environ, **(env or {})})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout) if proc.stdout else None
