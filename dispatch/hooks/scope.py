"""The guard's two rules beyond "run it through hostrun" (docs/agents.md, "The guard"):

- **A scope declaration** lets a person run a heavy command directly, on purpose: the escape
  variable (``[agents] escape_env``, ``HOSTRUN_DIRECT``) in front of the line holds
  ``kind=…; target=…; extent=…; reason=…``. The kind must be the command's own (a declared ``build``
  does not cover a test run), target and extent must be said, and the reason must be longer than
  ``escape_min`` characters: written down, not waved through.
- **A subagent never runs the whole test suite**, through hostrun or not: a suite is the main
  agent's to run (one at a time, with the machine in view); a subagent runs the tests of what it
  changed (``cargo test -p crate``, ``pytest tests/test_x.py``, ``-k name``).
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple
from dispatch.hooks import rules
from dispatch.hooks.shellwords import parse

KINDS = ("build", "test", "bench", "run", "check", "train")
KEYS = ("kind", "target", "extent", "reason")


class Declaration(NamedTuple):
    fields: dict[str, str]
    missing: tuple[str, ...]


def declaration(value: str) -> Declaration:
    """The declaration in the escape variable's value (``;`` between ``key=value`` parts). A value
    without any ``key=`` (the old form: a reason alone) is a reason with the rest missing."""
    fields: dict[str, str] = {}
    if "=" not in value:
        fields["reason"] = value.strip()
    else:
        for part in value.split(";"):
            key, eq, text = part.partition("=")
            if eq and key.strip().lower() in KEYS and text.strip():
                fields[key.strip().lower()] = text.strip()
    return Declaration(fields, tuple(k for k in KEYS if not fields.get(k)))


def kind_of(why: str) -> str:
    """The kind of work a classifier verdict names (``cargo test -p x [heavy: cargo test]``)."""
    pattern = why.partition("[")[2].partition("]")[0].lower()
    words = pattern.replace(":", " ").split()
    tail = " ".join(words[1:])
    if any(w in pattern for w in ("test", "jest", "vitest", "mocha", "tox", "nox", "unittest")) or \
            tail in ("t", "cargo t") or words[-1:] == ["t"]:
        return "test"
    if "bench" in pattern or "criterion" in pattern or "hyperfine" in pattern:
        return "bench"
    if any(w in pattern for w in ("train", "torchrun", "deepspeed", "accelerate")):
        return "train"
    if any(w in pattern for w in ("check", "clippy", "vet", "lint", "miri")) or words[-1:] == ["c"]:
        return "check"
    if words[-1:] in (["run"], ["r"]) or "workload option" in pattern or "qemu" in pattern:
        return "run"
    return "build"


def problems(decl: Declaration, kind: str, least: int) -> list[str]:
    """What a declaration lacks for a command of ``kind`` (none: it lets the command through)."""
    found = [f"no {key}" for key in decl.missing]
    declared = decl.fields.get("kind", "").lower()
    if declared and declared != kind:
        found.append(f"kind={declared}, but this command is a {kind}")
    reason = decl.fields.get("reason", "")
    if reason and len(reason) <= least:
        found.append(f"a reason of {len(reason)} characters (more than {least} needed)")
    return found


# ----------------------------------------------------------------------------- the whole suite
_SUITE_RUNNERS = {
    "cargo": ("test", "t", "nextest"), "pytest": (), "py.test": (), "go": ("test",),
    "npm": ("test", "t"), "pnpm": ("test",), "yarn": ("test",), "bun": ("test",),
    "make": ("test", "check", "tests"), "ctest": (), "tox": (), "nox": (), "mvn": ("test", "verify"),
    "gradle": ("test", "check"), "gradlew": ("test", "check"), "jest": (), "vitest": (),
    "dotnet": ("test",),
}
_NARROWING = ("-p", "--package", "-k", "-R", "--tests-regex", "-e", "--env", "-Dtest", "--tests",
              "-run", "--test", "--lib", "--bin", "--example", "-t", "--testNamePattern", "--filter")


def full_suite(command: str) -> str | None:
    """The whole-suite run in ``command``, if any (also inside ``hostrun … -- CMD``): a test runner
    with no narrowing option and no test named (``cargo test``, ``cargo test --workspace``,
    ``pytest``, ``go test ./...``, ``make check``, ``npm test``, ``ctest``, …)."""
    try:
        commands = parse(command).commands
    except Exception:
        return None
    for cmd in commands:
        words = list(cmd.words)
        if "--" in words and words and rules.tool_name(words[0]) in ("hostrun", "python", "python3"):
            words = words[words.index("--") + 1 :]
        while words and "=" in words[0] and words[0].partition("=")[0].isidentifier():
            words = words[1:]
        if words and rules.tool_name(words[0]) in ("bash", "sh") and "-c" in words[:-1]:
            inner = full_suite(words[words.index("-c") + 1])
            if inner:
                return inner
            continue
        found = _suite(words)
        if found:
            return found
    return None


def _suite(words: list[str]) -> str | None:
    if not words:
        return None
    name = rules.tool_name(words[0])
    subs = _SUITE_RUNNERS.get(name)
    if subs is None:
        return None
    args = words[1:]
    if subs:
        positional = [a for a in args if not a.startswith("-") and not a.startswith("+")]
        if not positional or positional[0] not in subs:
            return None
        sub = positional[0]
        args = args[args.index(sub) + 1 :]
        if name == "cargo" and sub == "nextest":
            args = args[1:] if args[:1] == ["run"] else args
        if name == "go":  # `go test ./...` is everything; `go test ./pkg` is not
            named = [a for a in args if not a.startswith("-")]
            if any(a.endswith("...") for a in named) or not named:
                return " ".join(words)
            return None
        if name in ("make", "npm", "pnpm", "yarn", "bun", "mvn", "gradle", "gradlew", "dotnet"):
            narrowed = any(a.startswith(_NARROWING) for a in args if a.startswith("-"))
            return None if narrowed else " ".join(words)
    if any(a in ("--workspace", "--all") for a in args):
        return " ".join(words)
    if any(a.split("=")[0] in _NARROWING for a in args if a.startswith("-")):
        return None
    before = args[: args.index("--")] if "--" in args else args
    named = [a for a in before if not a.startswith("-")]
    return None if named else " ".join(words)
