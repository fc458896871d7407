"""Is a shell command heavy? The one decision behind the agent hooks and the PATH shims.

``classify(command, cwd)`` reads a command line as an agent writes it and says whether it runs heavy
work (a build, a test suite, a training run), whether that work uses a GPU, whether it already runs
through ``hostrun``, and why. It runs before every shell command of every agent, so it is standard
library only and imports little (no ``re``, ``json`` or ``typing``).

How a command line is read (docs/agents.md, "Which commands are heavy"):

- ``shellwords.parse`` splits it into simple commands (lists, pipes, subshells, groups, ``$( … )``,
  backticks, here-docs); each is judged, and the line is heavy if any of them is.
- Prefixes are looked through: ``FOO=1``, ``env``, ``time``, ``timeout``, ``nice``, ``ionice``,
  ``nohup``, ``sudo``, ``command``, ``exec``, ``xargs``, ``find -exec``, ``uv run``, ``npx``, … ;
  shells' ``-c`` strings, ``eval``, and ``python -m MODULE`` (judged as MODULE) too.
- ``hostrun [OPTIONS] [--] CMD`` (any path to it, or ``python -m dispatch``) runs CMD through hostrun;
  ``hostrun lock DIR -- CMD`` does not (a lock is not a cap).
- Patterns (``rules``) decide a simple command; when none matches and the command names a script
  (``./scripts/all-tests``, ``bash run.sh``, ``source env.sh``), the script is read and its commands
  judged the same way: each file once per decision, at most ``max_depth`` scripts deep, only regular
  text files up to ``max_script_bytes`` with a shell shebang or none (a ``.py`` file or a python
  shebang is judged by the python rules on its name; ``.rs`` and other source files, binaries and
  other interpreters' scripts are never read as shell), all within ``deadline_s``.
- What could not be read to the end (a limit hit: size, depth, time) is *unknown*; unknown counts as
  heavy by default (``unknown_heavy``): routing a light command through hostrun costs a booking,
  letting a heavy one past costs the machine. ``Verdict.incomplete`` says so and ``why`` names it.
"""

from __future__ import annotations

import os
import stat
import time

from dispatch.core.records import NamedTuple
from dispatch.hooks import rules
from dispatch.hooks.shellwords import Simple, parse

MYPY = False
if MYPY:
    from collections.abc import Callable, Iterable, Mapping

    # a prefix's handler: judges what ``words`` runs; False when ``words`` is not that prefix after all
    Handler = Callable[["_Context", list[str], "_Frame", bool], bool]

DEADLINE_S = 0.2
MAX_DEPTH = 4
MAX_SCRIPT_BYTES = 256 * 1024
RUSTC_SMALL_BYTES = 64 * 1024  # `rustc hello.rs` is light; a crate root this big (or any unknown) is not

SHELLS = frozenset(("sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "fish"))
SHELL_EXTENSIONS = frozenset(("", ".sh", ".bash", ".zsh", ".ksh", ".dash", ".bats", ".command"))
GPU_ENV = frozenset(("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"))
SKIPPED_KEYWORDS = frozenset(("!", "if", "then", "elif", "else", "do", "while", "until", "fi", "done",
                              "esac", "{", "}", "time", "coproc"))
HEADER_KEYWORDS = frozenset(("for", "select", "case", "function", "in"))
HOSTRUN_SUBCOMMANDS = frozenset(("run", "doctor", "codes", "ledger", "report", "dispatch", "alerts",
                                 "capacity", "lock", "workdir", "preflight", "history", "hook",
                                 "agents", "shims", "watch"))


class Verdict(NamedTuple):
    """What ``classify`` decided.

    ``heavy``: some command in it does heavy work (directly or through hostrun), or could not be read
    to the end and ``unknown_heavy`` is on. ``gpu``: some of that work uses a GPU. ``through_hostrun``:
    it runs a job through hostrun (or is already inside one, ``$HOSTRUN_JOB``) and no heavy work runs
    beside it directly. ``why``: the deciding command, the pattern and where (``cargo test
    --workspace [heavy: cargo test] in ./scripts/all-tests line 12``). ``incomplete``: a limit (size,
    depth, time) stopped the reading somewhere.
    """

    heavy: bool
    gpu: bool
    through_hostrun: bool
    why: str
    incomplete: bool = False


class _Done(Exception):
    """Everything a verdict can say is known: stop reading."""


class _Context:
    """One decision's state: the tables, the limits, the files read, what was found so far."""

    def __init__(self, table: rules.Table, env: Mapping[str, str], deadline_s: float,
                 max_depth: int, max_bytes: int, unknown_heavy: bool) -> None:
        self.table, self.env, self.deadline_s = table, env, deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.max_depth, self.max_bytes, self.unknown_heavy = max_depth, max_bytes, unknown_heavy
        self.seen: set[str] = set()
        self.heavy_direct: str | None = None
        self.heavy_through: str | None = None
        self.gpu: str | None = None
        self.light: str | None = None
        self.unknown: str | None = None
        self.hostrun_job = False
        self.aliases: dict[str, list[str]] = {}  # ``alias c=cargo`` earlier in the line: c is cargo
        self.written: dict[str, str] = {}  # files this line writes before running them: path -> text

    def found(self, heavy: bool, gpu: bool, why: str, through: bool) -> None:
        if heavy and through:
            self.heavy_through = self.heavy_through or why
        elif heavy:
            self.heavy_direct = self.heavy_direct or why
        elif self.light is None:
            self.light = why
        if gpu:
            self.gpu = self.gpu or why
        if self.heavy_direct and self.gpu:
            raise _Done

    def give_up(self, why: str, frame: _Frame) -> None:
        """Reading stopped at a limit: unknown, which counts heavy when ``unknown_heavy``."""
        self.unknown = self.unknown or why
        if self.unknown_heavy:
            self.found(True, False, f"unknown, counted heavy: {why}{_at(frame)}", frame.through)

    def late(self, frame: _Frame) -> bool:
        if time.monotonic() > self.deadline:
            if not self.unknown:
                self.give_up(f"time limit of {self.deadline_s * 1000:.0f} ms reached", frame)
            return True
        return False


class _Frame:
    """Where a command runs: its directory (``cd`` moves it for the commands after), how deep in
    scripts, the location shown in ``why``, and whether it runs inside a hostrun job."""

    def __init__(self, cwd: str, depth: int, where: str, through: bool) -> None:
        self.cwd, self.depth, self.where, self.through = cwd, depth, where, through

    def child(self, where: str | None = None, through: bool | None = None, deeper: bool = True) -> _Frame:
        return _Frame(self.cwd, self.depth + deeper, self.where if where is None else where,
                      self.through if through is None else through)


def classify(command: str, cwd: str, *, extra_heavy: Iterable[str] = (), extra_light: Iterable[str] = (),
             extra_gpu: Iterable[str] = (), env: Mapping[str, str] | None = None,
             deadline_s: float = DEADLINE_S, max_depth: int = MAX_DEPTH,
             max_script_bytes: int = MAX_SCRIPT_BYTES, unknown_heavy: bool = True) -> Verdict:
    """Classify the shell command line ``command`` as run in directory ``cwd``.

    ``extra_heavy``/``extra_light``/``extra_gpu``: the project's patterns (``rules`` for the syntax;
    a light one that names a default heavy command takes it off the list). ``env``: the environment
    the command would run in (default ``os.environ``): ``$HOSTRUN_JOB`` means it is already inside a
    hostrun job, ``$HOME`` expands ``~`` in script paths. ``deadline_s``, ``max_depth`` and
    ``max_script_bytes`` bound the reading of scripts; ``unknown_heavy`` says what a reading cut short
    by them counts as. Never raises on malformed input.
    """
    return _run(command, None, cwd, extra_heavy, extra_light, extra_gpu, env, deadline_s, max_depth,
                max_script_bytes, unknown_heavy)


def classify_argv(argv: list[str], cwd: str, *, extra_heavy: Iterable[str] = (),
                  extra_light: Iterable[str] = (), extra_gpu: Iterable[str] = (),
                  env: Mapping[str, str] | None = None, deadline_s: float = DEADLINE_S,
                  max_depth: int = MAX_DEPTH, max_script_bytes: int = MAX_SCRIPT_BYTES,
                  unknown_heavy: bool = True) -> Verdict:
    """``classify`` for one command already split into words (a PATH shim's own argv)."""
    return _run(None, argv, cwd, extra_heavy, extra_light, extra_gpu, env, deadline_s, max_depth,
                max_script_bytes, unknown_heavy)


def _run(command: str | None, argv: list[str] | None, cwd: str, extra_heavy: Iterable[str],
         extra_light: Iterable[str], extra_gpu: Iterable[str], env: Mapping[str, str] | None,
         deadline_s: float, max_depth: int, max_bytes: int, unknown_heavy: bool) -> Verdict:
    env = os.environ if env is None else env
    ctx = _Context(rules.patterns(extra_heavy, extra_light, extra_gpu), env, deadline_s, max_depth,
                   max_bytes, unknown_heavy)
    inside_job = bool(env.get("HOSTRUN_JOB"))
    frame = _Frame(cwd, 0, "", inside_job)
    try:
        if argv is not None:
            _simple(ctx, Simple(list(argv), 1, []), frame, None)
        else:
            _text(ctx, command or "", frame)
    except _Done:
        pass
    except RecursionError:  # pathological nesting of $( … ) / -c strings
        try:
            ctx.give_up("nesting too deep to read", frame)
        except _Done:
            pass
    return _verdict(ctx, inside_job)


def _verdict(ctx: _Context, inside_job: bool) -> Verdict:
    heavy = bool(ctx.heavy_direct or ctx.heavy_through)
    through = inside_job or (ctx.hostrun_job and not ctx.heavy_direct)
    if ctx.heavy_direct:
        why = ctx.heavy_direct
    elif ctx.heavy_through:
        why = ctx.heavy_through if inside_job else f"{ctx.heavy_through} (through hostrun)"
    else:
        why = ctx.light or "nothing to run"
        if ctx.unknown:
            why = f"{why}; unknown: {ctx.unknown}"
    if inside_job and heavy:
        why += " (inside a hostrun job: $HOSTRUN_JOB)"
    return Verdict(heavy, bool(ctx.gpu), through, why, ctx.unknown is not None)


# -------------------------------------------------------------------- walking the commands
def _text(ctx: _Context, text: str, frame: _Frame, line_base: str | None = None) -> None:
    """Every simple command of ``text`` (a command line or a script's contents)."""
    parsed = parse(text, ctx.deadline)
    commands = parsed.commands
    for k, cmd in enumerate(commands):
        if ctx.late(frame):
            return
        if line_base is not None:  # a script's own frame: where its current line is
            frame.where = f"{line_base} line {cmd.line}"
        piped = commands[k - 1] if cmd.after_pipe and k > 0 else None
        _simple(ctx, cmd, frame, piped)
    if parsed.stopped:
        ctx.late(frame)


def _at(frame: _Frame) -> str:
    return f" in {frame.where}" if frame.where else ""


def _inside(frame: _Frame, what: str) -> _Frame:
    """A frame for a command string run by ``what`` (``bash -c``), shown as where it stands."""
    return frame.child(f"{what}{_at(frame)}")


def _shown(argv: list[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 60 else text[:57] + "..."


def _simple(ctx: _Context, cmd: Simple, frame: _Frame, piped: Simple | None) -> None:
    for sub in cmd.subs:  # $( … ) runs first, wherever it stands
        _text(ctx, sub, frame)
    _remember_writes(ctx, cmd, frame, piped)
    _argv(ctx, list(cmd.words), frame, cmd, piped, gpu_env=False)


def _written_text(cmd: Simple) -> str | None:
    """What ``cmd`` writes to its output: a here-doc's or here-string's body through ``cat``, or
    ``echo``/``printf``'s arguments (``\n`` read as printf would)."""
    name = rules.tool_name(cmd.words[0]) if cmd.words else ""
    if name == "cat" and cmd.stdin_text is not None:
        return cmd.stdin_text
    if name == "echo":
        return " ".join(w for w in cmd.words[1:] if w not in ("-n", "-e", "-E"))
    if name == "printf" and len(cmd.words) > 1:
        return " ".join(cmd.words[1:]).replace("\\n", "\n").replace("\\t", "\t")
    return None


def _remember_writes(ctx: _Context, cmd: Simple, frame: _Frame, piped: Simple | None) -> None:
    """A script written and run in the same line (``cat > t.sh <<EOF … EOF; bash t.sh``, ``echo …
    > f; sh f``, ``printf … | tee f; bash f``) does not exist yet when the line is judged: remember
    what is written, so that running it judges that text."""
    text = _written_text(cmd)
    targets = list(cmd.writes)
    if cmd.words and rules.tool_name(cmd.words[0]) == "tee" and piped is not None:
        text = _written_text(piped)
        targets += [w for w in cmd.words[1:] if not w.startswith("-")]
    for target in targets:
        path = os.path.normpath(os.path.join(frame.cwd, target))
        if text is None:
            ctx.written.pop(path, None)
        else:
            ctx.written[path] = text


def _argv(ctx: _Context, words: list[str], frame: _Frame, cmd: Simple | None, piped: Simple | None,
          gpu_env: bool) -> None:
    """Judge one simple command's words (after its substitutions): prefixes, then the command."""
    i = 0
    while i < len(words):  # assignments and reserved words before the command
        word = words[i]
        name, eq, _ = word.partition("=")
        if eq and name.isidentifier():
            gpu_env = gpu_env or name in GPU_ENV
            i += 1
        elif word in SKIPPED_KEYWORDS or (word in ("-p", "--") and i and words[i - 1] == "time"):
            i += 1
        else:
            break
    words = words[i:]
    if not words:
        return
    if words[0] in HEADER_KEYWORDS:
        return  # `for x in …`, `case … in`, `function f`: no command runs here
    if words[0] in ctx.aliases:
        words = [*ctx.aliases[words[0]], *words[1:]]
    if "$" in words[0] or "`" in words[0]:  # `$(echo cargo) build`, `$TOOL build`
        ctx.give_up(f"{_shown(words)} names a command only known when it runs", frame)
        return
    name = rules.tool_name(words[0])
    if name == "alias":
        _alias(ctx, words[1:])
        ctx.found(False, False, f"{_shown(words)} [defines an alias]{_at(frame)}", frame.through)
        return
    if name == "cd" or name == "pushd":
        _cd(frame, words, ctx.env.get("HOME"))
        return
    if name == "hostrun":
        _hostrun(ctx, words[1:], frame, gpu_env)
        return
    handler = _PREFIXES.get(name)
    if handler is not None and handler(ctx, words, frame, gpu_env):
        return
    if name in SHELLS or name in ("source", ".", "eval"):
        _shell(ctx, name, words, frame, cmd, piped)
        return
    if _is_python(name) and _python(ctx, words, frame, gpu_env):
        return
    _decide(ctx, words, frame, gpu_env)


def _decide(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool,
            read_script: bool = True) -> None:
    """The patterns decide; a script named by path with no pattern of its own is read instead."""
    best = rules.best_match(words, ctx.table)
    if best is not None and best.kind == rules.LIGHT:
        ctx.found(False, False, f"{_shown(words)} [light: {best.text}]{_at(frame)}", frame.through)
        return
    if best is not None:
        heavy_why = f"{_shown(words)} [{best.kind}: {best.text}]{_at(frame)}"
        if best.text == "rustc" and not best.project and _small_rustc(words, frame.cwd):
            ctx.found(False, False, f"{_shown(words)} [light: rustc on small input]{_at(frame)}",
                      frame.through)
            return
        ctx.found(True, best.kind == rules.GPU or gpu_env, heavy_why, frame.through)
        return
    if "/" in words[0] and _experiment(words):
        ctx.found(True, gpu_env, f"{_shown(words)} [heavy: a built program run with a workload "
                                 f"option]{_at(frame)}", frame.through)
        return
    if read_script and "/" in words[0] and _script(ctx, words[0], words[1:], frame, gpu_env, False):
        return
    if gpu_env:
        ctx.found(True, True, f"{_shown(words)} [gpu: CUDA_VISIBLE_DEVICES=…]{_at(frame)}", frame.through)
        return
    ctx.found(False, False, f"{_shown(words)} [no heavy pattern]{_at(frame)}", frame.through)


def _alias(ctx: _Context, definitions: list[str]) -> None:
    """``alias c=cargo 'b=cargo build'``: later commands of this line named ``c`` run ``cargo``."""
    for definition in definitions:
        name, eq, value = definition.partition("=")
        if eq and name and value:
            parsed = parse(value, ctx.deadline).commands
            if parsed and parsed[0].words:
                ctx.aliases[name] = list(parsed[0].words)


_BUILT_DIRS = ("target/release/", "target/debug/", "target/", "build/", "bin/", "out/", "dist/",
               "zig-out/", "_build/", "bazel-bin/", "cmake-build-")
_WORKLOAD_OPTIONS = ("--threads", "--thread", "-t", "--jobs", "-j", "--workers", "--nproc", "--procs",
                     "--np", "--size", "--iterations", "--iters", "--epochs", "--batch-size", "--steps",
                     "--samples", "--n-", "--num-", "--particles", "--grid", "--ranks")


def _experiment(words: list[str]) -> bool:
    """A program a build produced (``./target/release/sim``, ``build/bench``) run with an option
    that sizes its work (``--threads 31``, ``--size 1e9``, ``-j 8``): an experiment, heavy. Its
    ``--help``/``--version`` stay light (those patterns win before this is asked)."""
    path = words[0].lstrip("./")
    if not any(part in f"/{path}" for part in (f"/{d}" for d in _BUILT_DIRS)):
        return False
    for word in words[1:]:
        option = word.partition("=")[0]
        if option in _WORKLOAD_OPTIONS or any(option.startswith(p) for p in ("--n-", "--num-")):
            return True
        if option.startswith("-j") and option[2:].isdigit():
            return True
    return False


def _cd(frame: _Frame, words: list[str], home: str | None) -> None:
    """``cd DIR`` moves the directory the next commands (and the scripts they name) run in."""
    target = next((w for w in words[1:] if not w.startswith("-")), home)
    if target and target.startswith("~") and home:
        target = home + target[1:] if target in ("~",) or target.startswith("~/") else target
    if target and "$" not in target and "`" not in target:
        frame.cwd = os.path.normpath(os.path.join(frame.cwd, target))


# -------------------------------------------------------------------- hostrun
def _hostrun(ctx: _Context, args: list[str], frame: _Frame, gpu_env: bool) -> None:
    while args and (args[0] == "--config" or args[0].startswith("--config=")):
        args = args[2:] if args[0] == "--config" else args[1:]
    if args and args[0] in HOSTRUN_SUBCOMMANDS:
        sub, args = args[0], args[1:]
        if sub == "lock" and "--" in args:  # the lock holds a directory, it does not cap the command
            _argv(ctx, args[args.index("--") + 1 :], frame, None, None, gpu_env)
            return
        if sub != "run":
            ctx.found(False, False, f"hostrun {sub} [hostrun subcommand]{_at(frame)}", frame.through)
            return
    if args and args[0] in ("-h", "--help"):
        ctx.found(False, False, f"hostrun {args[0]}{_at(frame)}", frame.through)
        return
    from dispatch.core.runoptions import split_command  # the run options' own table, read only here

    options, command = split_command(list(args))
    if not command:
        ctx.found(False, False, f"hostrun {_shown(options)} [no command]{_at(frame)}", frame.through)
        return
    ctx.hostrun_job = True
    gpu_memory = any(o == "--gpu-memory" or o.startswith("--gpu-memory=") for o in options)
    if gpu_memory:
        ctx.found(False, True, f"hostrun --gpu-memory {_shown(command)}{_at(frame)}", True)
    _argv(ctx, command, frame.child(through=True, deeper=False), None, None, gpu_env)


# -------------------------------------------------------------------- prefixes
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

    def handler(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
        if words_in_name > 1 and (len(words) < words_in_name or
                                  words[words_in_name - 1] != _TWO_WORD.get(rules.tool_name(words[0]))):
            return False
        i = _skip_options(words, value_set, positional, start=words_in_name)
        rest = words[i:]
        if any(w in light for w in words[1:i]):
            ctx.found(False, False, f"{_shown(words)} [looks a command up]{_at(frame)}", frame.through)
            return True
        if not rest:
            ctx.found(False, False, f"{_shown(words)} [no command]{_at(frame)}", frame.through)
            return True
        _argv(ctx, rest, frame, None, None, gpu_env)
        return True

    return handler


def _env(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-S", "--split-string") and i + 1 < len(words):
            _text(ctx, " ".join(words[i + 1 :]), frame)
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
        ctx.found(False, False, f"{_shown(words)} [prints the environment]{_at(frame)}", frame.through)
        return True
    _argv(ctx, rest, frame, None, None, gpu_env)
    return True


def _find(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
    ran = False
    i = 1
    while i < len(words):
        if words[i] in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(words) and words[j] not in (";", "+"):
                j += 1
            if j > i + 1:
                _argv(ctx, words[i + 1 : j], frame, None, None, gpu_env)
                ran = True
            i = j
        i += 1
    return ran


def _string_runner(option: str) -> Handler:
    """A prefix whose ``option`` takes a whole command line (``flock F -c '…'``, ``su -c '…'``)."""
    def handler(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
        if option in words[1:-1]:
            _text(ctx, words[words.index(option, 1) + 1], _inside(frame, f"{words[0]} {option}"))
            return True
        return False

    return handler


def _every_positional(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
    """``hyperfine 'cargo build' 'make'``: each positional is a command line."""
    positionals, _ = rules.split_args("", words[1:])
    for text in positionals:
        _text(ctx, text, frame)
    return bool(positionals)


def _nix(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
    for flag in ("-c", "--command"):
        if flag in words:
            rest = words[words.index(flag) + 1 :]
            if rest:
                _argv(ctx, rest, frame, None, None, gpu_env)
                return True
    if rules.tool_name(words[0]) == "nix-shell":
        for flag in ("--run", "--command"):
            if flag in words[:-1]:
                _text(ctx, words[words.index(flag) + 1], frame)
                return True
    return False


_TMUX_RUNS = frozenset(("new", "new-session", "new-window", "neww", "split-window", "splitw",
                        "respawn-pane", "respawnp", "respawn-window", "respawnw"))
_TMUX_VALUES = frozenset(("-s", "-n", "-c", "-t", "-x", "-y", "-e", "-f", "-F", "-l", "-L", "-S", "-T"))


def _command_words(ctx: _Context, rest: list[str], frame: _Frame, gpu_env: bool) -> None:
    """A command given as one shell string (``tmux new -d 'cargo build'``) or as words."""
    if len(rest) == 1:
        _text(ctx, rest[0], frame)
    else:
        _argv(ctx, rest, frame, None, None, gpu_env)


def _tmux(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
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
            _text(ctx, " ".join(keys[j - 1 :]), _inside(frame, "tmux send-keys"))
            return True
        return False
    if sub not in _TMUX_RUNS:
        return False
    j = _skip_options([sub, *rest], _TMUX_VALUES)
    command = rest[j - 1 :]
    if not command:
        ctx.found(False, False, f"{_shown(words)} [a shell, no command]{_at(frame)}", frame.through)
        return True
    _command_words(ctx, command, _inside(frame, f"tmux {sub}"), gpu_env)
    return True


def _screen(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
    """``screen -dmS name cmd args``: a detached screen runs its command."""
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        flag = words[i]
        i += 2 if flag in ("-S", "-dmS", "-c", "-Logfile", "-p", "-t", "-X", "-T", "-h", "-s") else 1
    if i < len(words) and words[i] == "--":
        i += 1
    if i >= len(words):
        return False
    _command_words(ctx, words[i:], _inside(frame, "screen"), gpu_env)
    return True


_PARALLEL_VALUES = frozenset(("-j", "--jobs", "-P", "--max-procs", "-S", "--sshlogin", "--joblog",
                              "--results", "--halt", "-a", "--arg-file", "--colsep", "-d", "--delimiter",
                              "--timeout", "--retries", "--tmpdir", "-I", "--memfree", "--load",
                              "--delay", "--tag-string", "-n", "--max-args", "-N", "-E", "--eof"))


def _parallel(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
    """GNU ``parallel [options] COMMAND ::: args``: each job runs COMMAND."""
    i = _skip_options(words, _PARALLEL_VALUES)
    command = []
    for word in words[i:]:
        if word.startswith(":::"):
            break
        command.append(word)
    if not command:
        ctx.give_up(f"{_shown(words)}: the commands come from its input", frame)
        return True
    _command_words(ctx, command, _inside(frame, "parallel"), gpu_env)
    return True


def _first_of(*handlers: Handler) -> Handler:
    def handler(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
        return any(h(ctx, words, frame, gpu_env) for h in handlers)

    return handler


_TWO_WORD = {"poetry": "run", "pipenv": "run", "pdm": "run", "hatch": "run", "rye": "run", "uv": "run",
             "conda": "run", "mamba": "run", "micromamba": "run", "pnpm": "exec", "yarn": "exec",
             "bundle": "exec", "direnv": "exec", "perf": "stat", "mise": "exec", "asdf": "exec",
             "devbox": "run"}

_PREFIXES: dict[str, Handler] = {
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
    _PREFIXES[_name] = _prefix(_values, _positional, words_in_name=2)


# -------------------------------------------------------------------- shells and scripts
def _shell(ctx: _Context, name: str, words: list[str], frame: _Frame, cmd: Simple | None,
           piped: Simple | None) -> None:
    if name == "eval":
        _text(ctx, " ".join(words[1:]), _inside(frame, "eval"))
        return
    if name in ("source", "."):
        if len(words) > 1:
            _script(ctx, words[1], words[2:], frame, False, True)
        return
    i, run_string = 1, False
    while i < len(words):
        word = words[i]
        if word in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
        elif word.startswith("--"):
            i += 1
        elif len(word) > 1 and word[0] in "-+":
            run_string = run_string or (word[0] == "-" and "c" in word[1:])
            i += 1
        else:
            break
    if run_string:
        if i < len(words):
            _text(ctx, words[i], _inside(frame, f"{name} -c"))
        return
    if i < len(words):
        _script(ctx, words[i], words[i + 1 :], frame, False, True)
        return
    stdin = cmd.stdin_text if cmd is not None else None
    if stdin is None and piped is not None:
        producer = rules.tool_name(piped.words[0]) if piped.words else ""
        if producer in ("echo", "printf"):
            stdin = " ".join(piped.words[1:])
        else:
            stdin = piped.stdin_text if producer == "cat" else None
    if stdin is not None:
        _text(ctx, stdin, _inside(frame, f"{name}'s input"))
        return
    ctx.found(False, False, f"{name} [a shell reading what it is given]{_at(frame)}", frame.through)


def _is_python(name: str) -> bool:
    return name.startswith(("python", "pypy")) and name.rstrip("0123456789.").endswith(("python", "pypy"))


def _python(ctx: _Context, words: list[str], frame: _Frame, gpu_env: bool) -> bool:
    """``python -m MODULE …`` is judged as ``MODULE …`` (``-m dispatch`` is hostrun), falling back to the
    python rules; everything else goes to the patterns (``python train.py``)."""
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-W", "-X"):
            i += 2
        elif word == "-c":  # the code is not a script name: judge `python -c` alone
            _decide(ctx, [words[0], "-c"], frame, gpu_env, read_script=False)
            return True
        elif word == "-m" or (word.startswith("-m") and len(word) > 2):
            module = words[i + 1] if word == "-m" and i + 1 < len(words) else word[2:]
            rest = words[i + 2 :] if word == "-m" else words[i + 1 :]
            if not module:
                return False
            if module == "dispatch":
                _hostrun(ctx, rest, frame, gpu_env)
                return True
            if rules.best_match([module, *rest], ctx.table) is not None:
                _decide(ctx, [module, *rest], frame, gpu_env, read_script=False)
                return True
            _decide(ctx, [words[0], module, *rest], frame, gpu_env, read_script=False)
            return True
        elif len(word) > 1 and word[0] == "-" and word != "--":
            i += 1
        else:
            break
    _decide(ctx, words, frame, gpu_env, read_script=False)
    return True


_NOT_SHELL = frozenset((".rs", ".py", ".pyc", ".c", ".h", ".cc", ".cpp", ".hpp", ".go", ".java", ".kt",
                        ".js", ".mjs", ".ts", ".rb", ".pl", ".php", ".lua", ".toml", ".json", ".yaml",
                        ".yml", ".md", ".txt", ".lock", ".o", ".so", ".a", ".rlib", ".zip", ".gz", ".whl",
                        ".jar", ".ipynb", ".cfg", ".ini", ".html", ".css"))


def _interpreter(first_line: str) -> str | None:
    """The interpreter a ``#!`` line names (``env`` looked through), or None without one. A Rust
    ``#![attr]`` line is not a shebang."""
    if not first_line.startswith("#!") or first_line.startswith("#!["):
        return None
    parts = first_line[2:].split()
    if not parts:
        return None
    name = rules.tool_name(parts[0])
    if name == "env":
        rest = [p for p in parts[1:] if not p.startswith("-") and "=" not in p]
        return rules.tool_name(rest[0]) if rest else ""
    return name


def _script(ctx: _Context, word: str, args: list[str], frame: _Frame, gpu_env: bool,
            as_shell: bool) -> bool:
    """Read the script ``word`` names (a path as written, relative to the frame's directory) and
    judge its commands. ``as_shell``: a shell runs it (``bash f``, ``source f``), so its shebang does
    not matter. False when it is not a script to read (the caller decides by name then)."""
    if "$" in word or "`" in word:
        ctx.give_up(f"{_shown([word, *args])} names a script only known when it runs", frame)
        return True
    if word.startswith("~/") and ctx.env.get("HOME"):
        word_path = ctx.env["HOME"] + word[1:]
    else:
        word_path = word
    path = os.path.join(frame.cwd, word_path)
    shown = word
    written = ctx.written.get(os.path.normpath(path))
    if written is not None:  # written earlier in this very line: judge what was written
        if frame.depth >= ctx.max_depth:
            ctx.give_up(f"{shown}: scripts nested deeper than {ctx.max_depth}", frame)
            return True
        ctx.written.pop(os.path.normpath(path))  # once: a script that runs itself is read once
        _text(ctx, written, frame.child(), line_base=f"{shown} (written in this command)")
        return True
    try:
        st = os.stat(path)
    except OSError:
        ctx.found(False, False, f"{shown} [not found: nothing runs]{_at(frame)}", frame.through)
        return True
    if not stat.S_ISREG(st.st_mode):
        return False
    extension = os.path.splitext(os.path.basename(word))[1].lower()
    if extension == ".py":
        _decide(ctx, ["python3", word, *args], frame, gpu_env, read_script=False)
        return True
    if extension in _NOT_SHELL:
        ctx.found(False, False, f"{shown} [a {extension} file is not read as a script]{_at(frame)}",
                  frame.through)
        return True
    real = os.path.realpath(path)
    if real in ctx.seen:
        return True  # already judged in this decision (a script that sources itself, or a loop)
    if st.st_size > ctx.max_bytes:
        ctx.give_up(f"{shown} is too big to read ({st.st_size // 1024} KiB > {ctx.max_bytes // 1024} KiB)",
                    frame)
        return True
    if frame.depth >= ctx.max_depth:
        ctx.give_up(f"{shown}: scripts nested deeper than {ctx.max_depth}", frame)
        return True
    if ctx.late(frame):
        return True
    try:
        with open(path, "rb") as fh:
            data = fh.read(ctx.max_bytes + 1)
    except OSError as exc:
        ctx.give_up(f"{shown} cannot be read ({exc.strerror})", frame)
        return True
    if b"\0" in data[:8192]:
        return False  # a binary: judged by its name
    text = data.decode("utf-8", "replace")
    interpreter = _interpreter(text[:256].partition("\n")[0])
    if not as_shell and interpreter is not None and interpreter not in SHELLS:
        if _is_python(interpreter):
            _decide(ctx, ["python3", word, *args], frame, gpu_env, read_script=False)
            return True
        return False  # node, perl, …: judged by its name
    if not as_shell and interpreter is None and extension not in SHELL_EXTENSIONS:
        return False
    ctx.seen.add(real)
    _text(ctx, text, frame.child(), line_base=shown)
    return True


def _small_rustc(words: list[str], cwd: str) -> bool:
    """Whether every ``.rs`` input of a ``rustc`` call exists and all together are small."""
    total, inputs = 0, 0
    for word in words[1:]:
        if word.endswith(".rs") and not word.startswith("-"):
            try:
                total += os.stat(os.path.join(cwd, word)).st_size
            except OSError:
                return False
            inputs += 1
    return inputs > 0 and total < RUSTC_SMALL_BYTES
