"""``hostrun agents install|uninstall|status``: hostrun's hooks in Claude Code's ``settings.json``.

``install claude-code [--project|--user] [--mode M]`` merges four hook entries into
``<git top level or cwd>/.claude/settings.json`` (``--project``, the default) or
``~/.claude/settings.json`` (``--user``): PreToolUse (matcher ``Bash``) → ``hostrun hook
pre-tool-use``, SessionStart → ``hostrun hook session-start``, PostToolUse (every tool) → ``hostrun
hook post-tool-use``, PostToolUseFailure (every tool) → ``hostrun hook post-tool-use-failure`` and
Stop → ``hostrun hook stop``. Installing twice gives the same file; an older
install that lacks an entry gains it;
the user's other keys and hooks stay as they are (an entry of ours is replaced where it stands). The
file is replaced atomically with its mode and indentation kept (through a symlink, the file it points
to); a file that is not valid JSON is an error (exit 2) and is left untouched. ``uninstall`` gives
the file back byte for byte (or removes it, and a ``.claude`` directory the install made) when
nothing but the install changed it since: the install remembers the old text in the hooks' state
directory. Otherwise it removes exactly the entries of ours (a hook whose command is ``… hostrun hook
…``) and what they alone left empty.
``status`` says what is installed where (and which entries an install lacks) and feeds sample events
through the hooks (in process) to check the answers' shape; it exits 78 (``not-run``: the hooks do
not work as documented) when a check fails.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

from dispatch.core.errors import UsageError

MYPY = False
if MYPY:
    import argparse
    from collections.abc import Callable
    from typing import Any, NoReturn

AGENTS = ("claude-code",)
ACTIONS = ("install", "uninstall", "status")
EVENTS = {"PreToolUse": ("pre-tool-use", "Bash", 60), "SessionStart": ("session-start", None, 30),
          "PostToolUse": ("post-tool-use", None, 10),
          "PostToolUseFailure": ("post-tool-use-failure", None, 10), "Stop": ("stop", None, 30)}
MODES = ("remind", "wrap", "guard")


def _parser(name: str, text: str) -> argparse.ArgumentParser:
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"{message} (see '{self.prog} --help')")

    return Parser(prog=f"hostrun agents {name}", description=text)


def settings_path(user: bool, cwd: str | None = None, local: bool = False) -> str:
    """``~/.claude/settings.json``, or ``<git top level or cwd>/.claude/settings.json`` (shared
    through git), or with ``local`` that directory's ``settings.local.json`` (Claude Code's own
    uncommitted file: the place for a command line holding this machine's absolute paths)."""
    if user:
        from dispatch.core.configpath import user_home

        return os.path.join(user_home(), ".claude", "settings.json")
    from dispatch.hooks.rewrite import project_root

    name = "settings.local.json" if local else "settings.json"
    return os.path.join(project_root(cwd or os.getcwd()), ".claude", name)


def default_command(user: bool = False) -> str:
    """How the hook entries call hostrun: this very hostrun, by its absolute path (or this Python
    with ``-m dispatch``). Not a bare ``hostrun``: Claude Code runs hooks with its own PATH, where
    ``./scripts/setup``'s virtualenv is not, and a hook that cannot start (127) is a hook error on
    every call with protection off."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "hostrun" and os.path.isfile(argv0):
        return shlex.quote(os.path.abspath(argv0))
    return f"{shlex.quote(sys.executable)} -m dispatch"


def check_command(command: str) -> None:
    """Refuse (78) to install hook commands that would not start: ``COMMAND --version`` is run the
    way Claude Code runs a hook (``sh -c``)."""
    import subprocess

    from dispatch.core.errors import NotRunError

    try:
        done = subprocess.run(["sh", "-c", f"{command} --version"], capture_output=True, text=True,
                              timeout=60, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotRunError(f"the hooks would call {command!r}, which did not answer: {exc}") from None
    if done.returncode != 0 or "hostrun" not in done.stdout:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise NotRunError(f"the hooks would call {command!r}, which does not work here (exit "
                          f"{done.returncode}: {said[0]}); pass --command with one that does")


def is_ours(hook: object) -> bool:
    """A hook entry that runs ``hostrun hook …`` (any path to hostrun, or ``python -m dispatch``)."""
    if not isinstance(hook, dict) or not isinstance(hook.get("command"), str):
        return False
    try:
        words = shlex.split(hook["command"])
    except ValueError:
        return False
    for i, word in enumerate(words[:-1]):
        after = words[i + 1]
        if os.path.basename(word) == "hostrun" and after == "hook":
            return True
        if word == "-m" and after == "dispatch" and i + 2 < len(words) and words[i + 2] == "hook":
            return True
    return False


REWAKE_TIMEOUT = 3600  # seconds the background waiter may run (it ends itself before)


def entries(command: str, mode: str | None, config: str | None = None
            ) -> dict[str, list[tuple[str | None, dict[str, Any]]]]:
    """Per event: [(matcher, our hook entry)]. ``config``: ``hostrun --config X agents install`` puts
    ``--config X`` (absolute) in every command, as it was asked to use that file. Stop gets a second
    entry: the background waiter that wakes the idle session with an alert (``asyncRewake``)."""
    out: dict[str, list[tuple[str | None, dict[str, Any]]]] = {}
    tail = (f" --mode {mode}" if mode else "") + (
        f" --config {shlex.quote(os.path.abspath(config))}" if config else "")
    for event, (name, matcher, timeout) in EVENTS.items():
        out[event] = [(matcher, {"type": "command", "command": f"{command} hook {name}{tail}",
                                 "timeout": timeout})]
    out["Stop"].append((None, {"type": "command", "command": f"{command} hook rewake{tail}",
                               "timeout": REWAKE_TIMEOUT, "asyncRewake": True}))
    return out


def read(path: str) -> dict[str, Any] | None:
    """The settings file's object (None when there is none); UsageError when it is not JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); left as it is") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a JSON object; left as it is")
    hooks = data.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise UsageError(f"{path}: 'hooks' is not an object; left as it is")
    for event, groups in (hooks or {}).items():
        if not isinstance(groups, list):
            raise UsageError(f"{path}: hooks.{event} is not a list; left as it is")
    return data


def merge(data: dict[str, Any], wanted: dict[str, list[tuple[str | None, dict[str, Any]]]]
          ) -> dict[str, Any]:
    """``data`` with our entries: in order, each replaces an entry of ours where one stands under
    the same matcher, the rest go in one new group per matcher at the end; other entries of ours
    are removed. (So installing again gives the same file.)"""
    data = json.loads(json.dumps(data))  # a copy
    hooks = data.setdefault("hooks", {})
    for event, pending in wanted.items():
        pending = list(pending)
        groups = hooks.setdefault(event, [])
        for group in groups:
            if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
                continue
            kept = []
            for entry in group["hooks"]:
                if not is_ours(entry):
                    kept.append(entry)
                elif pending and group.get("matcher") == pending[0][0]:
                    kept.append(pending.pop(0)[1])
            group["hooks"] = kept
        hooks[event] = [g for g in groups if not _emptied(g)]
        for matcher, hook in pending:
            last = hooks[event][-1] if hooks[event] else None
            if last is not None and last.get("matcher") == matcher and all(is_ours(h) for h in last["hooks"]):
                last["hooks"].append(hook)
                continue
            group = {"matcher": matcher} if matcher is not None else {}
            group["hooks"] = [hook]
            hooks[event].append(group)
    return data


def _emptied(group: object) -> bool:
    return isinstance(group, dict) and group.get("hooks") == []


def remove(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without our entries, and without the groups, event lists and ``hooks`` object that
    only they filled."""
    data = json.loads(json.dumps(data))
    hooks = data.get("hooks")
    if not isinstance(hooks, dict):
        return data
    for event in list(hooks):
        groups = hooks[event]
        changed = False
        for group in groups:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                kept = [h for h in group["hooks"] if not is_ours(h)]
                changed = changed or len(kept) != len(group["hooks"])
                group["hooks"] = kept
        if changed:
            hooks[event] = [g for g in groups if not _emptied(g)]
            if not hooks[event]:
                del hooks[event]
    if not hooks:
        del data["hooks"]
    return data


def installed(data: dict[str, Any] | None) -> dict[str, list[str]]:
    """Per event, the commands of our entries in ``data``."""
    found: dict[str, list[str]] = {}
    for event, groups in ((data or {}).get("hooks") or {}).items():
        for group in groups if isinstance(groups, list) else []:
            for hook in (group.get("hooks") or []) if isinstance(group, dict) else []:
                if is_ours(hook):
                    found.setdefault(event, []).append(hook["command"])
    return found


def _text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def _indent(text: str | None) -> str | int:
    """The indentation the file already uses (its first indented line's), else 2 spaces: a file
    the user keeps with 4 spaces or tabs stays so."""
    for line in (text or "").splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            return line[: len(line) - len(stripped)]
    return 2


def write(path: str, data: dict[str, Any], user: bool, indent: str | int = 2) -> str:
    """Replace the file atomically, keeping its mode (a new one: 0644 in a project, 0600 for the
    user; its ``.claude`` directory 0755 / 0700); the text written."""
    from dispatch.core.atomicfile import write_atomic

    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600 if user else 0o644
        os.makedirs(os.path.dirname(real), mode=0o700 if user else 0o755, exist_ok=True)
    text = json.dumps(data, indent=indent) + "\n"
    write_atomic(real, text.encode(), mode, exact_mode=True)
    return text


def _record_name(path: str) -> str:
    from dispatch.core.fingerprint import short_hash

    return f"install-{short_hash(os.path.realpath(path).encode(), 16)}.json"


def _remember(path: str, before: str | None, dir_existed: bool, after: str) -> None:
    """What the file (and its directory) were before hostrun first added its hooks, and the text it
    wrote, so that ``uninstall`` can give the file back byte for byte (``_restore``). A reinstall
    over its own text keeps the first install's ``before``; over a file that already holds our
    hooks with no record of it, nothing is known, and nothing is remembered."""
    from dispatch.hooks import hookstate

    name = _record_name(path)
    old = hookstate.load(name)
    if isinstance(old, dict) and old.get("after") == before:
        before, dir_existed = old.get("before"), bool(old.get("dir_existed"))
    elif before is not None and installed(json.loads(before) if before.strip() else {}):
        return
    hookstate.save(name, {"before": before, "dir_existed": dir_existed, "after": after})


def _restore(path: str, current: str | None) -> bool:
    """Give the file back as it was before the install, when nothing but our hooks changed it since
    (its text is the one hostrun wrote): the old bytes, or no file (and no ``.claude`` directory,
    if the install made it and it is empty now). False when that cannot be known."""
    from dispatch.hooks import hookstate

    record = hookstate.load(_record_name(path))
    if not isinstance(record, dict) or current is None or record.get("after") != current:
        return False
    before = record.get("before")
    real = os.path.realpath(path)
    if isinstance(before, str):
        from dispatch.core.atomicfile import write_atomic

        write_atomic(real, before.encode(), os.stat(real).st_mode & 0o7777, exact_mode=True)
    else:
        os.unlink(real)
        if not record.get("dir_existed"):
            try:
                os.rmdir(os.path.dirname(real))
            except OSError:
                pass  # something else is in it now: it stays
    _forget(path)
    return True


def _forget(path: str) -> None:
    from dispatch.hooks import hookstate

    try:
        os.unlink(os.path.join(hookstate.directory(), _record_name(path)))
    except OSError:
        pass


def main(argv: list[str], say: Callable[[str], None]) -> int:
    if not argv or argv[0] not in ACTIONS:
        if argv and argv[0] in ("-h", "--help"):
            print("usage: hostrun agents {install,uninstall} claude-code [--project|--local|--user] "
                  "[--mode MODE] [--command CMD]\n       hostrun agents status [--json] [--config PATH] "
                  "[--no-round-trip] [--model MODEL]"
                  "\n\nhostrun's hooks in Claude Code's settings.json (docs/agents.md).")
            return 0
        raise UsageError(f"agents: choose one of {', '.join(ACTIONS)} (see 'hostrun agents --help')")
    action, rest = argv[0], argv[1:]
    if action == "status":
        return status(rest)
    p = _parser(action, "Add hostrun's hooks to Claude Code's settings.json (idempotent)."
                if action == "install" else "Remove exactly hostrun's hooks from Claude Code's "
                "settings.json.")
    p.add_argument("agent", choices=AGENTS, help="the coding agent")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--project", action="store_true",
                       help="<git top level or cwd>/.claude/settings.json (the default)")
    where.add_argument("--local", action="store_true",
                       help="<git top level or cwd>/.claude/settings.local.json (not committed)")
    where.add_argument("--user", action="store_true", help="~/.claude/settings.json")
    if action == "install":
        p.add_argument("--mode", choices=MODES, help="put --mode MODE in the hook's command "
                                                     "(default: [agents] mode of the config)")
        p.add_argument("--command", metavar="CMD", help="how the hooks call hostrun (default: "
                                                        "'hostrun'; with --user, this hostrun's path)")
    import argparse

    p.add_argument("--config", metavar="PATH", help=argparse.SUPPRESS)  # hostrun --config X agents …
    args = p.parse_args(rest)
    path = settings_path(args.user, local=args.local)
    data = read(path)
    text = _text(path) if data is not None else None
    if action == "install":
        command = args.command or default_command(args.user)
        check_command(command)
        new = merge(data or {}, entries(command, args.mode, args.config))
    else:
        if data is None:
            say(f"{path}: no such file: nothing to remove")
            return 0
        new = remove(data)
    if new == data:
        say(f"{path}: already {'installed' if action == 'install' else 'without hostrun hooks'}")
        return 0
    if action == "install":
        dir_existed = os.path.isdir(os.path.dirname(os.path.realpath(path)))
        after = write(path, new, args.user or args.local, _indent(text))
        _remember(path, text, dir_existed, after)
    elif not _restore(path, text):
        write(path, new, args.user or args.local, _indent(text))
        _forget(path)
    say(f"{path}: hostrun hooks {'installed' if action == 'install' else 'removed'}")
    root = os.path.dirname(os.path.dirname(path))
    if not args.user and action == "install" and os.path.realpath(os.getcwd()) != os.path.realpath(root):
        say(f"note: Claude Code reads {path} when it is started in {root}, not in {os.getcwd()}")
    return 0


STATUS_PROBE = '{"hook_event_name": "HostrunStatusProbe"}'


def real_run(command: str) -> dict[str, Any]:
    """Run one installed hook command the way Claude Code does (``sh -c``, the event on stdin), with
    an event no hook handles: a working command starts, reads it, says so on stderr and exits 0
    with no answer, touching nothing. Anything else is what Claude Code would meet too (127: not
    found, a traceback, a timeout)."""
    import subprocess

    try:
        done = subprocess.run(["sh", "-c", command], input=STATUS_PROBE, capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"command": command, "ok": False, "problem": f"did not finish: {exc}"}
    if done.returncode == 0 and not done.stdout and "nothing done" in done.stderr:
        return {"command": command, "ok": True, "problem": None}
    said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"command": command, "ok": False, "problem": f"exit {done.returncode}: {said[0]}"}


def status(argv: list[str]) -> int:
    """What is installed where, and the self-test; exit 0 when it passes, 78 (not-run: the hooks do
    not work as documented) when it does not."""
    p = _parser("status", "Where hostrun's hooks are installed, and a self-test that feeds sample "
                          "events through them.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", metavar="PATH", help="configuration file")
    p.add_argument("--no-round-trip", action="store_true",
                   help="skip the one real 'claude -p' run made when claude is on PATH")
    p.add_argument("--model", default="haiku", help="the model of that run (default: haiku)")
    args = p.parse_args(argv)
    from dispatch.config import load_settings

    load_settings(args.config)  # a broken config is the first thing to say (exit 2)
    places = []
    for user, local in ((False, False), (False, True), (True, False)):
        path = settings_path(user, local=local)
        try:
            found: dict[str, Any] = {"hooks": installed(read(path)), "error": None}
        except UsageError as exc:
            found = {"hooks": {}, "error": str(exc)}
        found["real_run"] = [real_run(command) for commands in found["hooks"].values()
                             for command in commands]
        places.append({"scope": "user" if user else "local" if local else "project", "path": path,
                       **found})
    from dispatch.core.exitcodes import ExitCode
    from dispatch.hooks.selftest import run_all

    checks = run_all(args.config)
    trip = None if args.no_round_trip else _round_trip(places, args.model)
    ok = (all(c["ok"] for c in checks) and all(r["ok"] for p in places for r in p["real_run"])
          and (trip is None or trip["ok"] is not False))
    failed = 0 if ok else int(ExitCode.NOT_RUN)
    if args.json:
        print(json.dumps({"installed": places, "self_test": checks, "client_round_trip": trip, "ok": ok},
                         indent=2))
        return failed
    from dispatch.core.text import printable

    for place in places:
        if place["error"]:
            state = place["error"]
        elif place["hooks"]:
            state = "; ".join(f"{e}: {', '.join(c)}" for e, c in place["hooks"].items())
            missing = [e for e in EVENTS if e not in place["hooks"]]
            if missing:
                state += f" (missing {', '.join(missing)}: run 'hostrun agents install' again)"
        else:
            state = "not installed"
        print(printable(f"{place['scope']}: {place['path']}: {state}"))
        for run in place["real_run"]:
            if not run["ok"]:
                print(printable(f"  FAIL as installed: {run['command']}: {run['problem']}"))
        if place["real_run"] and all(r["ok"] for r in place["real_run"]):
            print(f"  ok as installed: each of its {len(place['real_run'])} commands starts and answers")
    for check in checks:
        print(printable(f"self-test {'ok  ' if check['ok'] else 'FAIL'} {check['name']}"
                        + ("" if check["ok"] else f": {check['problem']}")))
    if trip is not None:
        print(printable(_trip_line(trip)))
    return failed


def _round_trip(places: list[dict[str, Any]], model: str) -> dict[str, Any] | None:
    """One real ``claude -p`` where the client is on PATH and hostrun's hooks are installed, in the
    directory whose settings hold them (the project's root; for the user's file, here)."""
    from dispatch.hooks import clienttrip

    client = clienttrip.find_client()
    where = next((p for p in places if p["hooks"]), None)
    if client is None or where is None:
        return None
    cwd = os.getcwd() if where["scope"] == "user" else os.path.dirname(os.path.dirname(where["path"]))
    return clienttrip.round_trip(client, cwd, model)


def _trip_line(trip: dict[str, Any]) -> str:
    who = f"Claude Code {trip['version'] or '(version unknown)'} ({trip['client']}, in {trip['cwd']})"
    if trip["ok"]:
        ran = sorted({h["event"] for h in trip["hooks"]})
        return (f"client round trip ok: {who} ran hostrun's hooks ({', '.join(ran)}) and ended in "
                f"{trip['seconds']} s (one request to {trip['model']})")
    if trip["ok"] is None:
        return f"client round trip incomplete: {who}: hostrun's hooks ran; {trip['problem']}"
    return f"client round trip FAIL: {who}: {trip['problem']}"
