"""What a PATH shim runs (``hostrun shims install`` writes the shims): find the real tool further
along ``PATH``, and run it through hostrun when the invocation is heavy, directly otherwise.

The real tool is the first executable of that name on ``PATH`` that is not in the shim's own directory
and not a shim of ours (``MARKER`` in its first bytes; ``dispatch.hooks.shimpath``), so two shim
directories on ``PATH`` never run each other. Inside a hostrun job (``$HOSTRUN_JOB`` set and this
process really in that job's cgroup) the real tool is exec'd directly: the job is booked already. A
light invocation is exec'd directly too (its exit status is the tool's own); a heavy one runs as
``hostrun --label <derived> --long-job-rule [--gpu-memory auto] -- REAL ARGS`` in this same process
(no second interpreter), with hostrun's exit code: the agent's runs get the long-job rule (244), and a
GPU invocation on a host with GPUs a VRAM booking from its label's record
(``dispatch.hooks.rewrite.agent_options``).

The project's ``[agents]`` patterns (``heavy``, ``light``, ``gpu``) take part, as in the hooks: the
configuration is loaded the cheap way (its cache: no pydantic while the file is unchanged). A
configuration that cannot be loaded does not stop a light tool: the defaults decide, and a light
invocation runs directly after one warning line (a heavy one goes to hostrun, which says what is wrong
with the configuration and exits 2).

Standard library only and no ``json``/``re``/``argparse``/``typing`` at import time: it runs before
every wrapped command.
"""

from __future__ import annotations

import os
import sys

from dispatch.hooks import find_real

MYPY = False
if MYPY:
    from typing import NoReturn


def _patterns() -> tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], str | None]:
    """The ``[agents]`` table's (heavy, light, gpu) patterns, from ``$HOSTRUN_CONFIG`` or the usual
    search; with a configuration that cannot be loaded, none, and why."""
    try:
        from dispatch.config import load_settings

        agents = load_settings().agents
    except Exception as exc:  # a broken config must not stop a light tool
        from dispatch.core import printable

        text = printable(" ".join(str(exc).split()) or type(exc).__name__)
        return ((), (), ()), f"configuration not usable ({text})"
    return (tuple(agents.heavy), tuple(agents.light), tuple(agents.gpu)), None


def main(tool: str, shim: str) -> NoReturn:
    """The shim ``shim`` (its own path) was run as ``tool`` with ``sys.argv[1:]``."""
    args = sys.argv[1:]
    real = find_real(tool, os.path.dirname(os.path.abspath(shim)))
    if real is None:
        from dispatch.core import NOT_FOUND  # failure paths only: exitcodes loads enum

        sys.stderr.write(f"hostrun shim: {tool}: no {tool} on PATH after {os.path.dirname(shim)}\n")
        os._exit(NOT_FOUND)
    from dispatch.core import enclosing_job

    if enclosing_job(os.environ) is None:
        from dispatch.hooks import classify_argv

        patterns, problem = _patterns()
        heavy, light, gpu = patterns
        verdict = classify_argv([tool, *args], os.getcwd(), extra_heavy=heavy, extra_light=light,
                                extra_gpu=gpu)
        if problem is not None and not verdict.heavy:
            sys.stderr.write(f"hostrun shim: {tool}: warning: {problem}; the project's [agents] "
                             "patterns are not applied\n")
        if verdict.heavy and not verdict.through_hostrun:
            from dispatch.cli.entry import leave
            from dispatch.cli.main import main as hostrun
            from dispatch.core import has_nvidia_gpus
            from dispatch.hooks import agent_options
            from dispatch.local import default_label

            options = agent_options(verdict.gpu and has_nvidia_gpus())
            leave(hostrun(["--label", default_label([tool, *args]), *options, "--", real, *args]))
    try:
        os.execv(real, [tool, *args])
    except OSError as exc:
        from dispatch.core import exec_failure

        code, reason = exec_failure(exc)  # as a shell says it: 127 not found, 126 not executable
        sys.stderr.write(f"hostrun shim: {tool}: cannot run {real}: {reason}\n")
        os._exit(code)
