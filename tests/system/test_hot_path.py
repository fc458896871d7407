"""The modules the per-call commands must not load (docs/design.md, "The hot path stays light"),
observed on real runs with ``-X importtime`` (each process lists every module it imported). A
regression here costs every ``hostrun`` call milliseconds, and nothing else would notice it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Hostrun
from tests.support.peers import setup as peer_setup

HEAVY = {"pydantic", "rich", "asyncio", "typing", "argparse"}
# Light enough alone, but each pulls in more (shutil: bz2, lzma, fnmatch; random: hashlib bits;
# warnings; re and json: their compilers and scanners; subprocess: selectors, threading; the sqlite3
# package: datetime for its adapters, where the ledger needs only the C module _sqlite3; base64: re).
RUN_PATH_AVOIDS = HEAVY | {"json", "re", "shutil", "warnings", "random", "subprocess", "gettext",
                           "locale", "hashlib", "dispatch.local.gpus.gpu", "dispatch.local.gpus.kernlog",
                           "sqlite3", "datetime", "base64",
                           # the C modules _signal and _socket do (signal and socket bring enum, and
                           # with it functools and collections: ~3 ms each); zlib, the ledger's schema
                           # (a run the engine booked opens no ledger) and the admission policy
                           "signal", "socket", "selectors", "enum", "functools", "collections",
                           "zlib", "dispatch.local.store.ledgerdb", "dispatch.local.admission.policy"}
REPORT_PATH_AVOIDS = HEAVY | {"shutil", "gettext", "random", "hashlib", "dispatch.config.model"}
PEER_RUN_AVOIDS = HEAVY | {"shutil", "gettext", "random", "hashlib"}


# What the console script does (pip's ``hostrun`` imports sys and calls entry); ``python -m
# dispatch`` would add runpy's own imports (warnings, contextlib) to the profile.
CONSOLE_SCRIPT = "from dispatch.cli.entry import entry; entry()"


def imported(hostrun: Hostrun, *args: str, **kw: Any) -> set[str]:
    argv = [sys.executable, "-X", "importtime", "-c", CONSOLE_SCRIPT, *hostrun.argv(*args)[3:]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "dispatch.cli.main" in names  # the profile was read: the command's own modules are in it
    return names


def test_a_plain_run_loads_none_of_the_heavy_modules(hostrun: Hostrun) -> None:
    hostrun.run("-m", "8M", "--", "true")  # the config cache is warm from here on
    assert imported(hostrun, "--", "true") & RUN_PATH_AVOIDS == set()
    # a size, a duration and a label, as most calls have
    typical = ("-m", "8M", "--max-runtime", "10m", "--label", "hot-path", "--", "true")
    assert imported(hostrun, *typical) & RUN_PATH_AVOIDS == set()


def test_a_plain_run_imports_no_cap_backend_that_cannot_work_here(hostrun: Hostrun) -> None:
    """On a cgroup v1 host (these machines) the shared, systemd and cgroup2 backends' probes would
    fail: their modules are not imported (~3 ms a run). Where mountinfo allows them, they are probed."""
    from dispatch.capping import ORDER, _self_files, candidates

    kept = candidates(_self_files())
    hostrun.run("--", "true")  # the config cache is warm from here on
    names = imported(hostrun, "--", "true")
    assert {f"dispatch.capping.{name}" for name in ORDER if name not in kept} & names == set()
    assert f"dispatch.capping.{kept[0]}" in names


def test_a_run_with_a_result_file_loads_none_of_the_heavy_modules(hostrun: Hostrun, tmp_path: Path) -> None:
    """Scripts and agents pass ``--result-file`` to every run: the file is JSON, written without json."""
    import json

    result = tmp_path / "result.json"
    hostrun.run("-m", "8M", "--", "true")  # the config cache is warm from here on
    names = imported(hostrun, "-m", "8M", "--result-file", str(result), "--", "true")
    assert names & RUN_PATH_AVOIDS == set()
    assert "dispatch.core.jsontext" in names  # the file written
    assert "_sqlite3" not in names  # booked, recorded and released by the engine: no ledger opened
    assert json.loads(result.read_text())["exit_code"] == 0


def test_a_json_report_loads_none_of_the_heavy_modules(hostrun: Hostrun) -> None:
    hostrun.run("report", "--json")
    assert imported(hostrun, "report", "--json") & REPORT_PATH_AVOIDS == set()
    assert imported(hostrun, "report", "--json", "--host", "local") & REPORT_PATH_AVOIDS == set()


def test_a_peer_run_loads_none_of_the_heavy_modules(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    _, tree = peer_setup(hostrun, peers, tmp_path)
    assert hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree / "src").returncode == 0
    names = imported(hostrun, "--peer", "-m", "64M", "--", "true", cwd=tree / "src")
    assert "dispatch.hosts.ssh.peerrun" in names
    assert names & PEER_RUN_AVOIDS == set()


# The agent hooks run before and after every tool call: a light command and a PostToolUse with no
# unread alert must not load json's decoder or encoder (each loads re, and re loads enum: ~15 ms),
# nor sqlite3 (bench/bench_hook.py, docs/agents.md).
HOOK_PATH_AVOIDS = HEAVY | {"json", "re", "sqlite3", "subprocess", "shutil", "dispatch.config.model"}


def hook_imports(hostrun: Hostrun, event: str, data: str, cwd: Path) -> set[str]:
    argv = [sys.executable, "-X", "importtime", "-c", CONSOLE_SCRIPT, "hook", event, "--config",
            str(hostrun.config_path)]
    proc = subprocess.run(argv, input=data, capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "", proc.stdout  # light: no answer
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "dispatch.hooks.claude" in names and "dispatch.config" in names  # the profile was read
    return names


def test_the_hooks_light_paths_load_neither_json_nor_re(hostrun: Hostrun, tmp_path: Path) -> None:
    import json

    common = {"session_id": "s1", "transcript_path": "/dev/null", "cwd": str(tmp_path),
              "permission_mode": "default", "tool_name": "Bash", "tool_input": {"command": "ls -la"}}
    pre = json.dumps({**common, "hook_event_name": "PreToolUse"})
    post = json.dumps({**common, "hook_event_name": "PostToolUse", "tool_response": {"stdout": ""}})
    for event, data in (("pre-tool-use", pre), ("post-tool-use", post), ("post-tool-use", post)):
        hook_imports(hostrun, event, data, tmp_path)  # the first calls warm the config cache
        assert hook_imports(hostrun, event, data, tmp_path) & HOOK_PATH_AVOIDS == set(), event
