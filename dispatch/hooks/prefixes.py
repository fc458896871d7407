"""Prefixes and wrappers: commands that run another command (``env``, ``sudo``, ``timeout``, ``xargs``,
``find -exec``, ``uv run``, ``tmux new``, ``parallel``, ``hyperfine``, ...), and how to find the
command each one runs.

``PREFIXES`` maps a program's base name to its handler. A handler judges what the prefix runs by
calling back into the walk through its ``Context`` (``ctx.words`` for a command given as words,
``ctx.text`` for one given as a shell string) and returns False when the words are not that prefix
after all (``uv sync``, ``tmux ls``), so the patterns judge them as a command of their own.
"""

from __future__ import annotations

from dispatch.hooks import rules
from dispatch.hooks.classifystate import at, inside, shown

MYPY = False
if MYPY:
    from collections.abc import Callable, Iterable

    from dispatch.hooks.classifystate import Context, Site

    # a prefix's handler: judges what ``words`` runs; False when ``words`` is not that prefix after all
    Handler = Callable[[Context, list[str], Site, bool], bool]


def _skip_options(words: list[str], values: frozenset[str], positional: int = 0,
                  start: int = 1) -> int:
    """Index of the command after a prefix's options (``values``: those taking the next word) and
    ``positional`` words of its own (``timeout``'s duration)."""
    i = start
    while i < len(words):
        word = words[i]
        if word == "--":
            i += 1
            break
        if len(word) > 1 and word[0] == "-":
            i += 2 if word in values else 1
            continue
        break
    return i + positional


def _prefix(values: Iterable[str] = (), positional: int = 0, words_in_name: int = 1,
            light_flags: Iterable[str] = ()) -> Handler:
    """A handler for a prefix command: skip its own words, judge the command it runs (if any)."""
    value_set = frozenset(values)
    light = frozenset(light_flags)

    def handler(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
        if words_in_name > 1 and (len(words) < words_in_name or
                                  words[words_in_name - 1] != _TWO_WORD.get(rules.tool_name(words[0]))):
            return False
        i = _skip_options(words, value_set, positional, start=words_in_name)
        rest = words[i:]
        if any(w in light for w in words[1:i]):
            ctx.found(False, False, f"{shown(words)} [looks a command up]{at(site)}", site.through)
            return True
        if not rest:
            ctx.found(False, False, f"{shown(words)} [no command]{at(site)}", site.through)
            return True
        ctx.words(rest, site, gpu_env)
        return True

    return handler


def _env(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-S", "--split-string") and i + 1 < len(words):
            ctx.text(" ".join(words[i + 1 :]), site)
            return True
        if word in ("-u", "--unset", "-C", "--chdir"):
            i += 2
        elif word == "--":
            i += 1
            break
        elif word.startswith("-") and len(word) > 1:
            i += 1
        else:
            break
    rest = words[i:]
    if not any("=" not in w for w in rest):
        ctx.found(False, False, f"{shown(words)} [prints the environment]{at(site)}", site.through)
        return True
    ctx.words(rest, site, gpu_env)
    return True


def _find(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    ran = False
    i = 1
    while i < len(words):
        if words[i] in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(words) and words[j] not in (";", "+"):
                j += 1
            if j > i + 1:
                ctx.words(words[i + 1 : j], site, gpu_env)
                ran = True
            i = j
        i += 1
    return ran


def _string_runner(option: str) -> Handler:
    """A prefix whose ``option`` takes a whole command line (``flock F -c '…'``, ``su -c '…'``)."""
    def handler(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
        if option in words[1:-1]:
            ctx.text(words[words.index(option, 1) + 1], inside(site, f"{words[0]} {option}"))
            return True
        return False

    return handler


def _every_positional(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    """``hyperfine 'cargo build' 'make'``: each positional is a command line."""
    positionals, _ = rules.split_args("", words[1:])
    for text in positionals:
        ctx.text(text, site)
    return bool(positionals)


def _nix(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    for flag in ("-c", "--command"):
        if flag in words:
            rest = words[words.index(flag) + 1 :]
            if rest:
                ctx.words(rest, site, gpu_env)
                return True
    if rules.tool_name(words[0]) == "nix-shell":
        for flag in ("--run", "--command"):
            if flag in words[:-1]:
                ctx.text(words[words.index(flag) + 1], site)
                return True
    return False


_TMUX_RUNS = frozenset(("new", "new-session", "new-window", "neww", "split-window", "splitw",
                        "respawn-pane", "respawnp", "respawn-window", "respawnw"))
_TMUX_VALUES = frozenset(("-s", "-n", "-c", "-t", "-x", "-y", "-e", "-f", "-F", "-l", "-L", "-S", "-T"))


def _command_words(ctx: Context, rest: list[str], site: Site, gpu_env: bool) -> None:
    """A command given as one shell string (``tmux new -d 'cargo build'``) or as words."""
    if len(rest) == 1:
        ctx.text(rest[0], site)
    else:
        ctx.words(rest, site, gpu_env)


def _tmux(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    """A detached tmux session, window or pane runs its command (``tmux new -d '…'``), and
    ``send-keys`` types one into a shell: both are work started from this line."""
    i = _skip_options(words, frozenset(("-L", "-S", "-f", "-c", "-T")))
    if i >= len(words):
        return False
    sub, rest = words[i], words[i + 1 :]
    if sub in ("send-keys", "send"):
        keys = [w for w in rest if w not in ("Enter", "C-m", "KPEnter")]
        j = _skip_options(["send-keys", *keys], frozenset(("-t", "-N")))
        if j - 1 < len(keys):
            ctx.text(" ".join(keys[j - 1 :]), inside(site, "tmux send-keys"))
            return True
        return False
    if sub not in _TMUX_RUNS:
        return False
    j = _skip_options([sub, *rest], _TMUX_VALUES)
    command = rest[j - 1 :]
    if not command:
        ctx.found(False, False, f"{shown(words)} [a shell, no command]{at(site)}", site.through)
        return True
    _command_words(ctx, command, inside(site, f"tmux {sub}"), gpu_env)
    return True


def _screen(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    """``screen -dmS name cmd args``: a detached screen runs its command."""
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        flag = words[i]
        i += 2 if flag in ("-S", "-dmS", "-c", "-Logfile", "-p", "-t", "-X", "-T", "-h", "-s") else 1
    if i < len(words) and words[i] == "--":
        i += 1
    if i >= len(words):
        return False
    _command_words(ctx, words[i:], inside(site, "screen"), gpu_env)
    return True


_PARALLEL_VALUES = frozenset(("-j", "--jobs", "-P", "--max-procs", "-S", "--sshlogin", "--joblog",
                              "--results", "--halt", "-a", "--arg-file", "--colsep", "-d", "--delimiter",
                              "--timeout", "--retries", "--tmpdir", "-I", "--memfree", "--load",
                              "--delay", "--tag-string", "-n", "--max-args", "-N", "-E", "--eof"))


def _parallel(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    """GNU ``parallel [options] COMMAND ::: args``: each job runs COMMAND."""
    i = _skip_options(words, _PARALLEL_VALUES)
    command = []
    for word in words[i:]:
        if word.startswith(":::"):
            break
        command.append(word)
    if not command:
        ctx.give_up(f"{shown(words)}: the commands come from its input", site)
        return True
    _command_words(ctx, command, inside(site, "parallel"), gpu_env)
    return True


def _first_of(*handlers: Handler) -> Handler:
    def handler(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
        return any(h(ctx, words, site, gpu_env) for h in handlers)

    return handler


_TWO_WORD = {"poetry": "run", "pipenv": "run", "pdm": "run", "hatch": "run", "rye": "run", "uv": "run",
             "conda": "run", "mamba": "run", "micromamba": "run", "pnpm": "exec", "yarn": "exec",
             "bundle": "exec", "direnv": "exec", "perf": "stat", "mise": "exec", "asdf": "exec",
             "devbox": "run"}

PREFIXES: dict[str, Handler] = {
    "env": _env,
    "time": _prefix(("-f", "--format", "-o", "--output")),
    "timeout": _prefix(("-s", "--signal", "-k", "--kill-after"), positional=1),
    "nice": _prefix(("-n", "--adjustment")),
    "ionice": _prefix(("-c", "-n", "-p", "-P", "-u", "--class", "--classdata")),
    "nohup": _prefix(),
    "sudo": _prefix(("-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user", "--group",
                     "--chdir", "--prompt", "--host", "--role", "--type", "--other-user")),
    "doas": _prefix(("-u", "-C")),
    "runuser": _prefix(("-u", "-g", "-G", "--user", "--group")),
    "command": _prefix(light_flags=("-v", "-V")),
    "builtin": _prefix(),
    "exec": _prefix(("-a",)),
    "xargs": _prefix(("-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--arg-file", "--delimiter",
                      "--eof", "--replace", "--max-lines", "--max-args", "--max-procs", "--max-chars")),
    "stdbuf": _prefix(("-i", "-o", "-e")),
    "taskset": _prefix(positional=1),
    "chrt": _prefix(("-T", "-P", "-D"), positional=1),
    "flock": _first_of(_string_runner("-c"), _prefix(("-w", "-E", "--timeout", "--conflict-exit-code"),
                                                      positional=1)),
    "su": _string_runner("-c"),
    "setsid": _prefix(),
    "unbuffer": _prefix(),
    "chronic": _prefix(),
    "catchsegv": _prefix(),
    "caffeinate": _prefix(("-t", "-w")),
    "ccache": _prefix(),
    "sccache": _prefix(),
    "distcc": _prefix(),
    "strace": _prefix(("-o", "-e", "-p", "-s", "-u", "-E", "-P", "-a", "-b", "-I", "-O", "-S", "-X")),
    "ltrace": _prefix(("-o", "-e", "-p", "-s", "-u", "-a", "-n")),
    "valgrind": _prefix(),
    "systemd-run": _prefix(("-p", "-u", "-E", "-M", "-H", "--property", "--unit", "--slice", "--setenv",
                            "--description", "--uid", "--gid", "--nice", "--working-directory",
                            "--machine", "--host")),
    "watch": _prefix(("-n", "--interval", "-d", "--differences")),
    "npx": _prefix(("-p", "--package")),
    "bunx": _prefix(),
    "find": _find,
    "tmux": _tmux,
    "screen": _screen,
    "parallel": _parallel,
    "hyperfine": _every_positional,
    "nix": _nix,
    "nix-shell": _nix,
}
for _name, _values, _positional in (
        ("poetry", (), 0), ("pipenv", (), 0), ("pdm", (), 0), ("hatch", (), 0), ("rye", (), 0),
        ("uv", ("--with", "-p", "--python", "--project", "--directory", "--package", "--extra",
                "--group", "--env-file", "--index", "--with-requirements"), 0),
        ("conda", ("-n", "-p", "--name", "--prefix"), 0), ("mamba", ("-n", "-p", "--name", "--prefix"), 0),
        ("micromamba", ("-n", "-p", "--name", "--prefix"), 0), ("pnpm", (), 0), ("yarn", (), 0),
        ("bundle", (), 0), ("direnv", (), 1), ("perf", ("-e", "-o", "-p", "-r", "-F", "-c"), 0),
        ("mise", (), 0), ("asdf", (), 0), ("devbox", (), 0)):
    PREFIXES[_name] = _prefix(_values, _positional, words_in_name=2)

