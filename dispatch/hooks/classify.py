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
  letting a heavy one past costs the machine. ``Classification.incomplete`` says so and ``why`` names it.

This module is the walk: a line's simple commands, their assignments, aliases, ``cd`` and
``hostrun``, and the patterns' decision. ``prefixes`` holds the commands that run another command
(``env``, ``sudo``, ``xargs``, ``tmux``, ...), ``scripts`` the shells, Python and the scripts a
command names; both call back into the walk through ``classifystate`` (one decision's state), so only
this module imports them.
"""

from __future__ import annotations

import os

from dispatch.core.records import NamedTuple
from dispatch.hooks import rules
from dispatch.hooks.classifystate import SHELLS, Context, Done, Site, Walk, at, is_python, shown
from dispatch.hooks.prefixes import PREFIXES
from dispatch.hooks.shellwords import Simple, parse

MYPY = False
if MYPY:
    from collections.abc import Iterable, Mapping

DEADLINE_S = 0.2
MAX_DEPTH = 4
MAX_SCRIPT_BYTES = 256 * 1024
RUSTC_SMALL_BYTES = 64 * 1024  # `rustc hello.rs` is light; a crate root this big (or any unknown) is not

GPU_ENV = frozenset(("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"))
SKIPPED_KEYWORDS = frozenset(("!", "if", "then", "elif", "else", "do", "while", "until", "fi", "done",
                              "esac", "{", "}", "time", "coproc"))
HEADER_KEYWORDS = frozenset(("for", "select", "case", "function", "in"))


class Classification(NamedTuple):
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


def classify(command: str, cwd: str, *, extra_heavy: Iterable[str] = (), extra_light: Iterable[str] = (),
             extra_gpu: Iterable[str] = (), env: Mapping[str, str] | None = None,
             deadline_s: float = DEADLINE_S, max_depth: int = MAX_DEPTH,
             max_script_bytes: int = MAX_SCRIPT_BYTES, unknown_heavy: bool = True) -> Classification:
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
                  unknown_heavy: bool = True) -> Classification:
    """``classify`` for one command already split into words (a PATH shim's own argv)."""
    return _run(None, argv, cwd, extra_heavy, extra_light, extra_gpu, env, deadline_s, max_depth,
                max_script_bytes, unknown_heavy)


def _run(command: str | None, argv: list[str] | None, cwd: str, extra_heavy: Iterable[str],
         extra_light: Iterable[str], extra_gpu: Iterable[str], env: Mapping[str, str] | None,
         deadline_s: float, max_depth: int, max_bytes: int, unknown_heavy: bool) -> Classification:
    env = os.environ if env is None else env
    ctx = Context(rules.patterns(extra_heavy, extra_light, extra_gpu), env, deadline_s, max_depth,
                  max_bytes, unknown_heavy, _WALK)
    inside_job = bool(env.get("HOSTRUN_JOB"))
    site = Site(cwd, 0, "", inside_job)
    try:
        if argv is not None:
            _simple(ctx, Simple(list(argv), 1, []), site, None)
        else:
            _text(ctx, command or "", site)
    except Done:
        pass
    except RecursionError:  # pathological nesting of $( … ) / -c strings
        try:
            ctx.give_up("nesting too deep to read", site)
        except Done:
            pass
    return _verdict(ctx, inside_job)


def _verdict(ctx: Context, inside_job: bool) -> Classification:
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
    return Classification(heavy, bool(ctx.gpu), through, why, ctx.unknown is not None)


# -------------------------------------------------------------------- walking the commands
def _text(ctx: Context, text: str, site: Site, line_base: str | None = None) -> None:
    """Every simple command of ``text`` (a command line or a script's contents)."""
    parsed = parse(text, ctx.deadline)
    commands = parsed.commands
    for k, cmd in enumerate(commands):
        if ctx.late(site):
            return
        if line_base is not None:  # a script's own site: where its current line is
            site.where = f"{line_base} line {cmd.line}"
        piped = commands[k - 1] if cmd.after_pipe and k > 0 else None
        _simple(ctx, cmd, site, piped)
    if parsed.stopped:
        ctx.late(site)


def _simple(ctx: Context, cmd: Simple, site: Site, piped: Simple | None) -> None:
    for sub in cmd.subs:  # $( … ) runs first, wherever it stands
        _text(ctx, sub, site)
    _remember_writes(ctx, cmd, site, piped)
    _argv(ctx, list(cmd.words), site, cmd, piped, gpu_env=False)


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


def _remember_writes(ctx: Context, cmd: Simple, site: Site, piped: Simple | None) -> None:
    """A script written and run in the same line (``cat > t.sh <<EOF … EOF; bash t.sh``, ``echo …
    > f; sh f``, ``printf … | tee f; bash f``) does not exist yet when the line is judged: remember
    what is written, so that running it judges that text."""
    text = _written_text(cmd)
    targets = list(cmd.writes)
    if cmd.words and rules.tool_name(cmd.words[0]) == "tee" and piped is not None:
        text = _written_text(piped)
        targets += [w for w in cmd.words[1:] if not w.startswith("-")]
    for target in targets:
        path = os.path.normpath(os.path.join(site.cwd, target))
        if text is None:
            ctx.written.pop(path, None)
        else:
            ctx.written[path] = text


def _argv(ctx: Context, words: list[str], site: Site, cmd: Simple | None, piped: Simple | None,
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
        ctx.give_up(f"{shown(words)} names a command only known when it runs", site)
        return
    name = rules.tool_name(words[0])
    if name == "alias":
        _alias(ctx, words[1:])
        ctx.found(False, False, f"{shown(words)} [defines an alias]{at(site)}", site.through)
        return
    if name == "cd" or name == "pushd":
        _cd(site, words, ctx.env.get("HOME"))
        return
    if name == "hostrun":
        _hostrun(ctx, words[1:], site, gpu_env)
        return
    handler = PREFIXES.get(name)
    if handler is not None and handler(ctx, words, site, gpu_env):
        return
    if name in SHELLS or name in ("source", ".", "eval"):
        from dispatch.hooks import scripts  # here and below: only a command that needs it loads it

        scripts.shell(ctx, name, words, site, cmd, piped)
        return
    if is_python(name):
        from dispatch.hooks import scripts

        if scripts.python(ctx, words, site, gpu_env):
            return
    _decide(ctx, words, site, gpu_env)


def _decide(ctx: Context, words: list[str], site: Site, gpu_env: bool,
            read_script: bool = True) -> None:
    """The patterns decide; a script named by path with no pattern of its own is read instead."""
    best = rules.best_match(words, ctx.table)
    if best is not None and best.kind == rules.LIGHT:
        ctx.found(False, False, f"{shown(words)} [light: {best.text}]{at(site)}", site.through)
        return
    if best is not None:
        heavy_why = f"{shown(words)} [{best.kind}: {best.text}]{at(site)}"
        if best.text == "rustc" and not best.project and _small_rustc(words, site.cwd):
            ctx.found(False, False, f"{shown(words)} [light: rustc on small input]{at(site)}",
                      site.through)
            return
        ctx.found(True, best.kind == rules.GPU or gpu_env, heavy_why, site.through)
        return
    if "/" in words[0] and _experiment(words):
        ctx.found(True, gpu_env, f"{shown(words)} [heavy: a built program run with a workload "
                                 f"option]{at(site)}", site.through)
        return
    if read_script and "/" in words[0]:
        from dispatch.hooks import scripts

        if scripts.script(ctx, words[0], words[1:], site, gpu_env, False):
            return
    if gpu_env:
        ctx.found(True, True, f"{shown(words)} [gpu: CUDA_VISIBLE_DEVICES=…]{at(site)}", site.through)
        return
    ctx.found(False, False, f"{shown(words)} [no heavy pattern]{at(site)}", site.through)


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


def _alias(ctx: Context, definitions: list[str]) -> None:
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


def _cd(site: Site, words: list[str], home: str | None) -> None:
    """``cd DIR`` moves the directory the next commands (and the scripts they name) run in."""
    target = next((w for w in words[1:] if not w.startswith("-")), home)
    if target and target.startswith("~") and home:
        target = home + target[1:] if target in ("~",) or target.startswith("~/") else target
    if target and "$" not in target and "`" not in target:
        site.cwd = os.path.normpath(os.path.join(site.cwd, target))


# -------------------------------------------------------------------- hostrun
def _hostrun(ctx: Context, args: list[str], site: Site, gpu_env: bool) -> None:
    from dispatch.core.runoptions import SUBCOMMANDS, split_command  # their own tables, read only here

    while args and (args[0] == "--config" or args[0].startswith("--config=")):
        args = args[2:] if args[0] == "--config" else args[1:]
    if args and args[0] in SUBCOMMANDS:
        sub, args = args[0], args[1:]
        if sub == "lock" and "--" in args:  # the lock holds a directory, it does not cap the command
            _argv(ctx, args[args.index("--") + 1 :], site, None, None, gpu_env)
            return
        if sub != "run":
            ctx.found(False, False, f"hostrun {sub} [hostrun subcommand]{at(site)}", site.through)
            return
    if args and args[0] in ("-h", "--help"):
        ctx.found(False, False, f"hostrun {args[0]}{at(site)}", site.through)
        return
    options, command = split_command(list(args))
    if not command:
        ctx.found(False, False, f"hostrun {shown(options)} [no command]{at(site)}", site.through)
        return
    ctx.hostrun_job = True
    gpu_memory = any(o == "--gpu-memory" or o.startswith("--gpu-memory=") for o in options)
    if gpu_memory:
        ctx.found(False, True, f"hostrun --gpu-memory {shown(command)}{at(site)}", True)
    _argv(ctx, command, site.child(through=True, deeper=False), None, None, gpu_env)


# the steps prefixes and scripts call back into (classifystate.Walk)
_WALK = Walk(text=_text, argv=_argv, decide=_decide, hostrun=_hostrun)
