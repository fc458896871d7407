"""Which commands are heavy: the default patterns, the pattern syntax, and the matching.

A pattern is words separated by blanks (docs/agents.md, "Which commands are heavy"):

- the first word matches the program: its base name (``cargo`` matches ``/usr/bin/cargo``), or the
  word as written when the pattern's word has a ``/`` (``./scripts/slow-*``);
- a later word starting with ``-`` is an option that must appear among the arguments, anywhere before
  a ``--`` (``pytest --collect-only``, ``* --help``);
- any other later word must match the command's positional arguments in order, from the first
  (options and the values of a tool's known value-taking options skipped): ``cargo test`` matches
  ``cargo +nightly --locked test -p x``, ``npm run build`` matches ``npm --prefix web run build``;
- in every word ``*`` matches any run of characters (``/`` included) and ``?`` one character.

When several patterns match one command, the one with the most words decides; on a tie a project's
pattern beats a default one, then light beats heavy. So ``cargo test --help`` is light (``* --help``
ties with ``cargo test``), and a project makes a default heavy command light by naming it as light.
A GPU pattern is a heavy pattern that also marks the command as using a GPU.
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Iterable

HEAVY, LIGHT, GPU = "heavy", "light", "gpu"

DEFAULT_HEAVY = (
    # Rust: everything that compiles; `cargo check` too (a big workspace's check takes GBs)
    "cargo build", "cargo b", "cargo test", "cargo t", "cargo bench", "cargo nextest", "cargo clippy",
    "cargo run", "cargo r", "cargo check", "cargo c", "cargo doc", "cargo d", "cargo install",
    "cargo fix", "cargo miri", "cargo llvm-cov", "cargo tarpaulin", "cargo criterion", "cargo fuzz",
    "cargo xtask", "cargo mutants", "cargo hack", "cargo udeps", "cargo rustc", "cargo zigbuild",
    "cargo-nextest", "rustc",
    # C, C++ and generic build systems
    "make", "gmake", "ninja", "samu", "cmake --build", "meson compile", "meson test", "ctest", "scons",
    "bazel build", "bazel test", "bazel run", "bazel coverage", "bazelisk build", "bazelisk test",
    "bazelisk run", "buck build", "buck test", "buck run", "buck2 build", "buck2 test", "buck2 run",
    "zig build", "nix build", "nix-build", "docker build", "docker buildx build", "podman build",
    # Python
    "pytest", "py.test", "tox", "nox", "unittest", "python* setup.py build*", "python* setup.py bdist*",
    "python* setup.py install", "python* setup.py develop", "python* setup.py test", "python* manage.py test",
    "maturin build", "maturin develop",
    # Go, JavaScript, JVM, .NET and others
    "go build", "go test", "go install", "go run", "go vet",
    "npm test", "npm t", "npm run build*", "npm run test*", "npm run-script build*",
    "npm run-script test*",
    "pnpm test", "pnpm build", "pnpm run build*", "pnpm run test*", "yarn test", "yarn build",
    "yarn run build*", "yarn run test*", "bun test", "bun run build*", "bun run test*",
    "jest", "vitest", "mocha", "tsc", "webpack", "vite build", "next build",
    "mvn", "mvnw", "gradle", "gradlew", "sbt", "dotnet build", "dotnet test", "dotnet run",
    "dotnet publish", "swift build", "swift test", "cabal build", "cabal test", "stack build",
    "stack test", "mix compile", "mix test", "xcodebuild", "dune build", "dune test", "dune runtest",
    "opam install", "lake build", "cabal install",
    # whole machines: emulators and VMs
    "qemu-system-*", "qemu-kvm", "firecracker", "cloud-hypervisor", "vagrant up", "emulator",
)

DEFAULT_GPU = (
    "torchrun", "accelerate launch", "deepspeed", "python* *train*",
    "torch.distributed.run", "torch.distributed.launch",  # as `python -m ...`
)

DEFAULT_LIGHT = (
    "* --help", "* -h", "* --version", "cargo -V", "rustc -V", "python* -V", "pytest -V", "mvn* -v",
    "cargo fmt", "cargo metadata", "cargo tree", "cargo clean", "cargo search", "cargo --list",
    "cargo help", "cargo locate-project", "cargo pkgid", "cargo new", "cargo init", "cargo add",
    "cargo remove", "cargo update", "cargo fetch", "cargo generate-lockfile", "cargo verify-project",
    "cargo read-manifest", "cargo version", "cargo vendor", "cargo publish --dry-run",
    "rustc --print", "rustc --explain",
    "pytest --collect-only", "pytest --co", "pytest --fixtures", "pytest --markers",
    "make -n", "make --dry-run", "make --just-print", "make -q", "make --question", "make clean",
    "make help", "ninja -t", "ninja -n", "configure",
    # everyday tools, named so that e.g. `CUDA_VISIBLE_DEVICES=0 nvidia-smi` stays light
    "git", "ls", "rg", "grep", "cat", "echo", "printf", "head", "tail", "less", "wc", "find", "fd",
    "sed", "awk", "pwd", "cd", "which", "true", "false", "test", "[", "[[", "diff", "stat", "du", "df",
    "ps", "free", "nvidia-smi", "kill", "jq", "sort", "uniq", "cut", "tr", "tee", "touch", "mkdir",
    "rm", "cp", "mv", "ln", "chmod", "tar", "curl", "wget", "ssh", "scp", "rsync", "sleep", "date",
    "export", "unset", "set", "read", "exit", "return", "pip", "pip3", "uv pip",
)

# Options that take the next word as their value, per tool: skipped when looking for positionals.
VALUE_OPTIONS = {
    "cargo": frozenset(("--manifest-path", "--config", "-Z", "--color", "-C", "--target-dir", "-p",
                        "--package", "-j", "--jobs", "--target", "--features", "-F", "--profile")),
    "npm": frozenset(("--prefix", "-w", "--workspace")),
    "pnpm": frozenset(("--filter", "-F", "-C", "--dir")),
    "yarn": frozenset(("--cwd",)),
    "bun": frozenset(("--cwd",)),
    "go": frozenset(("-C",)),
    "make": frozenset(("-C", "-f", "-I", "-o", "-W", "--file", "--directory", "--makefile")),
    "ninja": frozenset(("-C", "-f", "-j", "-l", "-k", "-d", "-w")),
    "cmake": frozenset(("-S", "-B", "-G", "-C", "-T", "-A")),
    "meson": frozenset(("-C",)),
    "git": frozenset(("-C", "-c")),
    "docker": frozenset(("-H", "--context", "-c", "-l", "--config", "--log-level")),
    "dotnet": frozenset(),
}
NUMERIC_VALUE_OPTIONS = frozenset(("-j", "-l"))  # make -j 8 test: a number after them is a value


def glob(pattern: str, text: str) -> bool:
    """``*`` (any run, ``/`` included) and ``?`` (one character); everything else literal. Iterative
    with one backtrack point, so no pattern is exponential (and no ``re``/``fnmatch`` import)."""
    if "?" not in pattern:  # the usual shapes, without the general loop
        stars = pattern.count("*")
        if stars == 0:
            return pattern == text
        if pattern == "*":
            return True
        if stars == 1 and pattern[-1] == "*":
            return text.startswith(pattern[:-1])
        if stars == 2 and pattern[0] == "*" and pattern[-1] == "*":
            return pattern[1:-1] in text
    p = t = 0
    star, mark = -1, 0
    while t < len(text):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == text[t]):
            p += 1
            t += 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark = p, t
            p += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            t = mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


class Pattern(NamedTuple):
    """One compiled pattern (see the module's docstring for the syntax)."""

    text: str
    program: str
    positionals: tuple[str, ...]
    options: tuple[str, ...]
    kind: str  # HEAVY, LIGHT or GPU
    project: bool  # from the project's configuration (beats a default on a tie)

    @property
    def size(self) -> int:
        return 1 + len(self.positionals) + len(self.options)


def compile_patterns(texts: Iterable[str], kind: str, project: bool) -> list[Pattern]:
    """``texts`` as patterns; blank ones are skipped."""
    out = []
    for text in texts:
        words = text.split()
        if not words:
            continue
        rest = words[1:]
        out.append(Pattern(" ".join(words), words[0], tuple(w for w in rest if not w.startswith("-")),
                           tuple(w for w in rest if w.startswith("-")), kind, project))
    return out


class Table:
    """Patterns indexed by their literal program name; those whose program is a glob or a path are
    tried for every command (a handful), so one command costs a few matches, not hundreds."""

    def __init__(self, pats: list[Pattern]) -> None:
        self.by_name: dict[str, list[Pattern]] = {}
        self.others: dict[str, list[Pattern]] = {}  # by their program's glob or path
        for pat in pats:
            literal = not ("*" in pat.program or "?" in pat.program or "/" in pat.program)
            (self.by_name if literal else self.others).setdefault(pat.program, []).append(pat)

    def candidates(self, program: str, name: str) -> list[Pattern]:
        """The patterns whose program matches (``name``: the base name of ``program``)."""
        found = list(self.by_name.get(name, ()))
        for glob_, pats in self.others.items():
            if glob(glob_, program if "/" in glob_ else name):
                found += pats
        return found


_DEFAULTS: list[Pattern] = []
_CACHE: dict[tuple[tuple[str, ...], ...], Table] = {}


def patterns(extra_heavy: Iterable[str] = (), extra_light: Iterable[str] = (),
             extra_gpu: Iterable[str] = ()) -> Table:
    """The defaults and the project's patterns, indexed (cached per process and pattern set)."""
    key = (tuple(extra_heavy), tuple(extra_light), tuple(extra_gpu))
    table = _CACHE.get(key)
    if table is None:
        if not _DEFAULTS:
            _DEFAULTS.extend(compile_patterns(DEFAULT_HEAVY, HEAVY, False) +
                             compile_patterns(DEFAULT_GPU, GPU, False) +
                             compile_patterns(DEFAULT_LIGHT, LIGHT, False))
        table = _CACHE[key] = Table(_DEFAULTS + compile_patterns(key[0], HEAVY, True) +
                                    compile_patterns(key[1], LIGHT, True) +
                                    compile_patterns(key[2], GPU, True))
    return table


def tool_name(program: str) -> str:
    """``/usr/bin/python3.11`` → ``python3.11``; the key of ``VALUE_OPTIONS`` is the bare tool."""
    return program.rpartition("/")[2]


def split_args(name: str, args: list[str]) -> tuple[list[str], list[str]]:
    """(positionals, options) of ``args`` up to a ``--``, skipping the values of ``name``'s known
    value-taking options (``cargo --manifest-path X test``: ``X`` is not a positional)."""
    values = VALUE_OPTIONS.get(name, frozenset())
    positionals: list[str] = []
    options: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if len(arg) > 1 and arg[0] in "-+":
            options.append(arg.split("=", 1)[0] if arg.startswith("--") else arg)
            if arg in values or (arg in NUMERIC_VALUE_OPTIONS and i < len(args) and args[i].isdigit()):
                i += 1
            continue
        positionals.append(arg)
    return positionals, options


def best_match(argv: list[str], table: Table) -> Pattern | None:
    """The pattern that decides for ``argv`` (most words; then project; then light), or None."""
    program = argv[0]
    name = tool_name(program)
    split: tuple[list[str], list[str]] | None = None
    best: Pattern | None = None
    for pat in table.candidates(program, name):
        if pat.positionals or pat.options:
            if split is None:
                split = split_args(name, argv[1:])
            positionals, options = split
            if len(pat.positionals) > len(positionals):
                continue
            if not all(glob(p, a) for p, a in zip(pat.positionals, positionals)):
                continue
            if not all(any(glob(o, a) for a in options) for o in pat.options):
                continue
        if best is None or _rank(pat) > _rank(best):
            best = pat
    return best


def _rank(pat: Pattern) -> tuple[int, bool, bool]:
    return pat.size, pat.project, pat.kind == LIGHT
