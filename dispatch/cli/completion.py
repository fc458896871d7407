"""``hostrun completion bash|zsh|fish``: the shell's completion script; and ``hostrun completion
--complete -- WORDS...``, which the script calls on every TAB with the words typed so far (the last
one being completed) and which prints the candidates, one per line.

What completes: the subcommands; each subcommand's actions (``workdir list``) and options; the run
options before ``--``; the configured host names after ``--host``/``--peer``; the labels this
machine has recorded after ``-l``/``--label``; an option's fixed values where its help lists them
(``--mode remind|wrap|guard``). A path is left to the shell's own file completion (no candidates).

The options are read from each command's own ``--help`` (run in this process, its output captured),
so they are declared once, where the command parses them.
"""

from __future__ import annotations

import io
import os
import re
import sys
from contextlib import redirect_stderr, redirect_stdout

from dispatch.cli.common import COMMANDS
from dispatch.core import PROG, RUN_OPTIONS, HostrunError, UsageError

MYPY = False
if MYPY:
    from dispatch.core import Settings

SHELLS = ("bash", "zsh", "fish")
HOST_OPTIONS = ("--host", "--peer")
LABEL_OPTIONS = ("-l", "--label")
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)(?:[ =]([A-Z][A-Z_,.]*|[a-z-]+(?:\|[a-z-]+)+))?")
CHOICES = re.compile(r"[{\[]([a-z][a-z-]*(?:[,|][a-z][a-z-]*)+)[}\]]")

BASH = f"""# hostrun completion for bash: eval "$({PROG} completion bash)" (e.g. in ~/.bashrc)
_hostrun() {{
    local IFS=$'\\n'
    COMPREPLY=($({PROG} completion --complete -- "${{COMP_WORDS[@]:1:COMP_CWORD}}" 2>/dev/null))
}}
complete -o default -F _hostrun {PROG}
"""
ZSH = f"""#compdef {PROG}
# hostrun completion for zsh: eval "$({PROG} completion zsh)" (e.g. in ~/.zshrc, after compinit)
_hostrun() {{
    local -a candidates
    candidates=("${{(@f)$({PROG} completion --complete -- "${{(@)words[2,CURRENT]}}" 2>/dev/null)}}")
    if (( ${{#candidates[@]}} )) && [[ -n "${{candidates[1]}}" ]]; then
        compadd -- "${{candidates[@]}}"
    else
        _files
    fi
}}
compdef _hostrun {PROG}
"""
FISH = f"""# hostrun completion for fish: {PROG} completion fish > ~/.config/fish/completions/{PROG}.fish
function __hostrun_complete
    set -l tokens (commandline -opc) (commandline -ct)
    {PROG} completion --complete -- $tokens[2..-1] 2>/dev/null
end
complete -c {PROG} -a '(__hostrun_complete)'
"""
SCRIPTS = {"bash": BASH, "zsh": ZSH, "fish": FISH}


def cmd_completion(argv: list[str]) -> int:
    if argv[:1] == ["--complete"]:
        words = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        print("\n".join(candidates(words or [""])))
        return 0
    if len(argv) != 1 or argv[0] not in (*SHELLS, "-h", "--help"):
        raise UsageError(f"completion: name a shell: {', '.join(SHELLS)} (see '{PROG} completion --help')")
    if argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} completion {{{','.join(SHELLS)}}}\n\nPrint the shell's completion script: "
              f"eval \"$({PROG} completion bash)\" in ~/.bashrc, the same for zsh after compinit, "
              f"'{PROG} completion fish > ~/.config/fish/completions/{PROG}.fish' for fish.")
        return 0
    sys.stdout.write(SCRIPTS[argv[0]])
    return 0


def candidates(words: list[str]) -> list[str]:
    """What may follow ``hostrun`` and ``words[:-1]`` in place of ``words[-1]`` (the prefix typed)."""
    *before, current = words
    if "--" in before:
        return []  # the command: the shell's own completion
    config = _config_path(before)
    command = next((w for w in before if w in COMMANDS), None)
    if command is None:  # a run's options, or a subcommand
        if before and _takes_value(before[-1], _run_options()):
            return _values(before[-1], _run_options(), current, config)
        pool = [*sorted(_run_options()), "--help", "--version"] if current.startswith("-") \
            else [name for name in COMMANDS if name != "run"]
        return [c for c in pool if c.startswith(current)]
    after = before[before.index(command) + 1:]
    actions = _actions(command)
    action = next((w for w in after if w in actions), None) if actions else None
    options = _run_options() if command in ("run", "dispatch") else _options(command, action)
    if after and _takes_value(after[-1], options):
        return _values(after[-1], options, current, config)
    if actions and action is None and not current.startswith("-"):
        return [a for a in actions if a.startswith(current)]
    if current.startswith("-"):
        return [o for o in sorted(options) if o.startswith(current)]
    return []


def _run_options() -> dict[str, str | None]:
    return {flag: opt.metavar for opt in RUN_OPTIONS for flag in opt.flags}


def _help(command: str, action: str | None) -> str:
    """A command's ``--help``, run here with its output captured (it runs nothing else)."""
    from dispatch.cli.main import command as handler

    out = io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(io.StringIO()):
            handler(command)([action, "--help"] if action else ["--help"])
    except (SystemExit, HostrunError):
        pass
    return out.getvalue()


def _actions(command: str) -> list[str]:
    """The words that may follow the command (``workdir {claim,list,clean}``, ``hook [EVENT|...]``):
    the first choice after its name on each usage line of its help."""
    found: list[str] = []
    for line in _help(command, None).splitlines():
        _, named, rest = line.partition(f"{PROG} {command} ")
        choice = CHOICES.match(rest) if named else None
        words = re.split(r"[,|]", choice.group(1)) if choice is not None else rest.split()[:1]
        found += [w for w in words if named and re.fullmatch(r"[a-z][a-z-]*", w) and w not in found]
    return found


def _options(command: str, action: str | None) -> dict[str, str | None]:
    """Each option of the action's help (else the command's), with its value's name (None: a
    switch)."""
    found: dict[str, str | None] = {}
    own = _help(command, action) if action else ""  # an action's own, else the command's
    for flag, value in OPTION.findall(own if OPTION.search(own) else _help(command, None)):
        if flag not in found or value:
            found[flag] = value or None
    found.pop("-h", None)
    return found


def _takes_value(word: str, options: dict[str, str | None]) -> bool:
    return word in options and options[word] is not None


def _values(option: str, options: dict[str, str | None], current: str, config: str | None) -> list[str]:
    """An option's value: host names, labels, the choices its help lists; else the shell's files."""
    if option in HOST_OPTIONS:
        settings = _settings(config)
        pool = list(settings.hosts) if settings is not None else []
    elif option in LABEL_OPTIONS:
        pool = _labels(_settings(config))
    else:
        metavar = options[option] or ""
        pool = metavar.split("|") if "|" in metavar else []
    return [v for v in pool if v.startswith(current)]


def _config_path(words: list[str]) -> str | None:
    for i, word in enumerate(words):
        if word == "--config" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--config="):
            return word.split("=", 1)[1]
    return None


def _settings(config: str | None) -> Settings | None:
    """The settings, or None when they cannot be read (a completion never fails loudly)."""
    from dispatch.config import load_settings

    try:
        return load_settings(config)
    except (HostrunError, OSError):
        return None


def _labels(settings: Settings | None) -> list[str]:
    """The labels in this machine's peak table (read only: a completion writes nothing)."""
    import sqlite3

    if settings is None:
        return []
    path = os.path.join(settings.state_dir, "ledger.sqlite3")
    if not os.path.exists(path):
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        try:
            return sorted({row[0] for row in db.execute("SELECT label FROM peaks")})
        finally:
            db.close()
    except sqlite3.Error:
        return []
