"""Which settings a Claude Code hook runs with: the project's ``hosts.toml``, found from the project
rather than from the agent's working directory, and what the user is told when it is broken.

A hook never stops an agent because of itself, so a configuration that cannot be loaded is one
line on stderr and no answer, except once per problem: then a ``systemMessage`` the user sees.
"""

from __future__ import annotations

import os

from dispatch.hooks.claudeevent import event_cwd, note, short

MYPY = False
if MYPY:
    from collections.abc import Mapping
    from typing import TextIO

    from dispatch.core.settings import Settings
    from dispatch.hooks.claudeevent import HookArgs
    from dispatch.hooks.hookshape import HookAnswer, HookEvent


def project_root(data: HookEvent, environ: Mapping[str, str] | None = None) -> str:
    """Where the project is: ``$CLAUDE_PROJECT_DIR`` (set by Claude Code for hook commands), else
    the git top level of the event's ``cwd``."""
    env = os.environ if environ is None else environ
    root = env.get("CLAUDE_PROJECT_DIR")
    if root and os.path.isdir(root):
        return root
    cwd = os.path.abspath(event_cwd(data))  # the git top level above it (rewrite.project_root,
    path = cwd  # without importing rewrite and shlex on the light path)
    while not os.path.exists(os.path.join(path, ".git")):
        parent = os.path.dirname(path)
        if parent == path:
            return cwd
        path = parent
    return path


def project_config(data: HookEvent, environ: Mapping[str, str] | None = None) -> str | None:
    """The project's ``hosts.toml``, found from the project rather than from the hook's working
    directory (which follows the agent's ``cd``): ``$CLAUDE_PROJECT_DIR`` (Claude Code sets it for
    hook commands), else the git top level of the event's ``cwd``. None: the usual search applies
    (``$HOSTRUN_CONFIG``, ``./hosts.toml``, ``~/.config/hostrun/hosts.toml``)."""
    env = os.environ if environ is None else environ
    if env.get("HOSTRUN_CONFIG"):
        return None
    candidate = os.path.join(project_root(data, env), "hosts.toml")
    return candidate if os.path.isfile(candidate) else None


def hook_settings(args: HookArgs, err: TextIO, data: HookEvent | None = None) -> Settings | None:
    """The settings the hook runs with (``args.settings`` when given); None when the configuration
    is broken, with ``args.problem`` saying why."""
    if args.settings is not None:
        return args.settings
    from dispatch.config import load_settings
    from dispatch.core.errors import HostrunError

    explicit = args.config or (project_config(data) if data is not None else None)
    try:
        return load_settings(explicit)
    except HostrunError as exc:
        args.problem = f"hostrun's configuration is broken: {exc}"
        note(f"configuration: {exc}: nothing done", err)
        return None


def problem_answer(args: HookArgs) -> HookAnswer | None:
    """A broken configuration reaches the user, not only the debug log: a ``systemMessage`` (shown
    to the user) at the first event after the problem appears, once per problem; the hooks do
    nothing until it is fixed, and in guard mode that means heavy commands run unguarded, which is
    said too."""
    problem = args.problem
    if problem is None or not _first_time(problem):
        return None
    off = ("guard mode is OFF until it is fixed: heavy commands run without hostrun's memory cap"
           if args.mode == "guard" else "hostrun's hooks do nothing until it is fixed")
    return {"systemMessage": f"hostrun: {short(problem, 600)}; {off} (run 'hostrun agents status')"}


def _first_time(problem: str) -> bool:
    """Whether ``problem`` has not been told yet (remembered in the user's cache, by digest, the
    last 50); a cache that cannot be used means telling it every time rather than never."""
    import hashlib

    from dispatch.hooks import hookstate

    digest = hashlib.sha256(problem.encode()).hexdigest()[:16]
    told = hookstate.load("problems-told.json")
    told = [str(d) for d in told] if isinstance(told, list) else []
    if digest in told:
        return False
    hookstate.save("problems-told.json", [*told[-49:], digest])
    return True
