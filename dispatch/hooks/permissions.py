"""Would Claude Code have run this Bash command without asking? Its permission rules, read here.

Why: ``wrap`` mode rewrites a heavy command (``updatedInput``) and must then say ``allow`` or
``ask``. ``ask`` everywhere prompted for commands the user's own rules already allow and, in
``dontAsk`` mode or under ``claude -p``, turned every heavy command into a denial; ``allow``
everywhere would skip prompts the user wants. So the decision follows the user's rules for the
**original** command (a rule written for ``cargo test`` cannot match the rewritten
``hostrun … -- cargo test``):

- a ``deny`` rule matches: leave the command alone (no rewrite): Claude Code denies it as it would;
- an ``ask`` rule matches: ``ask`` (the user sees the rewritten command);
- an ``allow`` rule matches, or the mode is ``bypassPermissions``: ``allow``;
- no rule: ``ask`` in the modes that prompt (``default``, ``acceptEdits``); in ``dontAsk`` and
  ``plan``, leave it alone (Claude Code refuses it there whatever hostrun does).

The rules: ``permissions.allow/ask/deny`` of the managed, project-local, project and user settings
files, all together (a deny anywhere wins), the project's allow rules only once the user trusted the
workspace (``workspace_trusted``), as the client does, in Claude Code's syntax: ``Bash`` and ``Bash(*)`` (any
command), ``Bash(cmd)`` (exactly), ``Bash(prefix:*)`` (the prefix as a whole word, then anything),
and ``*`` as "any characters" elsewhere (a single trailing `` *`` also matches nothing). A command
with several parts (``&&``, ``;``, ``|``, a substitution) is pre-approved only by a rule for any
command: Claude Code wants every part allowed, and a wrong "allowed" would skip a prompt. Rules
given on Claude Code's command line (``--allowedTools``) are not visible to a hook.
"""

from __future__ import annotations

import json
import os

MYPY = False
if MYPY:
    from collections.abc import Iterable, Mapping

MANAGED = "/etc/claude-code/managed-settings.json"
COMPOUND = ("&&", "||", ";", "|", "\n", "$(", "`", "&")
PROMPTING_MODES = ("default", "acceptEdits")


def _config_dir(environ: Mapping[str, str]) -> str:
    """Claude Code's user directory: ``$CLAUDE_CONFIG_DIR``, else ``~/.claude``."""
    from dispatch.core.configpath import user_home

    return environ.get("CLAUDE_CONFIG_DIR") or os.path.join(user_home(environ), ".claude")


def settings_files(root: str, environ: Mapping[str, str]) -> list[str]:
    return [MANAGED, *project_files(root), os.path.join(_config_dir(environ), "settings.json")]


def project_files(root: str) -> list[str]:
    return [os.path.join(root, ".claude", "settings.local.json"),
            os.path.join(root, ".claude", "settings.json")]


def workspace_trusted(root: str, environ: Mapping[str, str]) -> bool:
    """Whether the user accepted Claude Code's trust dialog for ``root`` or a directory above it
    (``projects.<dir>.hasTrustDialogAccepted`` in its ``.claude.json``: ``~/.claude.json``, or in
    ``$CLAUDE_CONFIG_DIR``). Until then the client ignores the project's own allow rules (a
    checkout cannot pre-approve its commands), so the hook must too."""
    from dispatch.core.configpath import user_home

    configured = environ.get("CLAUDE_CONFIG_DIR")
    path = os.path.join(configured, ".claude.json") if configured else os.path.join(
        user_home(environ), ".claude.json")
    try:
        with open(path, encoding="utf-8") as fh:
            projects = json.load(fh).get("projects")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(projects, dict):
        return False
    directory = os.path.realpath(root)
    while True:
        entry = projects.get(directory)
        if isinstance(entry, dict) and entry.get("hasTrustDialogAccepted") is True:
            return True
        parent = os.path.dirname(directory)
        if parent == directory:
            return False
        directory = parent


def rules(paths: Iterable[str]) -> dict[str, list[str]]:
    """The Bash rules of ``paths`` by behaviour; files missing or unreadable add none."""
    found: dict[str, list[str]] = {"allow": [], "ask": [], "deny": []}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        permissions = data.get("permissions") if isinstance(data, dict) else None
        if not isinstance(permissions, dict):
            continue
        for behaviour, listed in found.items():
            entries = permissions.get(behaviour)
            if isinstance(entries, list):
                listed.extend(e.strip() for e in entries
                              if isinstance(e, str) and e.strip().startswith("Bash"))
    return found


def _glob(pattern: str, text: str) -> bool:
    """``*`` as any characters, everything else literal."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return text == pattern
    if not text.startswith(parts[0]):
        return False
    pos = len(parts[0])
    for middle in parts[1:-1]:
        found = text.find(middle, pos)
        if found < 0:
            return False
        pos = found + len(middle)
    return text.endswith(parts[-1]) and len(text) - len(parts[-1]) >= pos


def rule_matches(rule: str, command: str) -> bool:
    if rule in ("Bash", "Bash(*)"):
        return True
    if not (rule.startswith("Bash(") and rule.endswith(")")):
        return False
    plain = command.replace(">&", "").replace("&>", "")  # redirections (2>&1), not a second command
    if any(op in plain for op in COMPOUND):
        return False  # several commands: only a rule for any command covers them all
    spec, cmd = rule[5:-1], command.strip()
    if spec.endswith(":*"):
        prefix = spec[:-2]
        return cmd == prefix or cmd.startswith(prefix + " ")
    if spec.endswith(" *") and spec.count("*") == 1 and cmd == spec[:-2]:
        return True
    return _glob(spec, cmd)


def decide(command: str, mode: object, root: str, environ: Mapping[str, str] | None = None) -> str:
    """``allow``, ``ask`` or ``leave`` (no rewrite: Claude Code decides on the original command)."""
    env = os.environ if environ is None else environ
    found = rules(settings_files(root, env))
    if not workspace_trusted(root, env):  # the project's deny and ask rules still count
        others = [f for f in settings_files(root, env) if f not in project_files(root)]
        found["allow"] = rules(others)["allow"]
    if any(rule_matches(r, command) for r in found["deny"]):
        return "leave"
    if any(rule_matches(r, command) for r in found["ask"]):
        return "ask"
    if mode == "bypassPermissions" or any(rule_matches(r, command) for r in found["allow"]):
        return "allow"
    return "ask" if mode in PROMPTING_MODES or mode is None else "leave"
