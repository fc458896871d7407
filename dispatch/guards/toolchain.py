"""Toolchain probes: run the same commands (``rustc -Vv``, ``cargo -V``, ...) on both hosts and compare.

A build synced to the peer must be built by the same toolchain, or its results mean nothing. Which
probes a job needs follows from what it runs (``probes_for``): Rust's for cargo/rustc, ``python3 -V``
for python/pytest, ``node -v`` for node/npm, ``go version`` for go, ``cc --version`` for make/cc/cmake;
a ``sh -c`` command line or a script in the tree is read for those programs too. A job that runs none
of them (``cat a.txt``) is compared on nothing: a peer without Rust must not refuse it. A probe whose
program is missing on both sides is fine; missing on one side is a mismatch. Probes run in the
job's directory (rustup's directory overrides and ``rust-toolchain`` files apply there), so the peer
seeds the tree's toolchain files into its copy before it probes (``seed``): the sync comes after.

Outputs are cached, so an unchanged toolchain costs a few ``stat`` calls, not a run. A wrapper such as
rustup's ``rustc``/``cargo`` proxy stays the same file while the toolchain behind it changes, so the
key is not only the program file: it holds everything that selects the toolchain (see ``_key``).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import stat
import subprocess

from dispatch.core.atomicfile import write_atomic
from dispatch.core.fingerprint import short_hash
from dispatch.core.pathsearch import which
from dispatch.guards.trust import own_file_ok, private_dir_ok

MYPY = False
if MYPY:
    from collections.abc import Mapping, Sequence
    from typing import Any

PROBE_TIMEOUT = 30.0
RUST = ("rustc -Vv", "cargo -V")
PYTHON = ("python3 -V",)
NODE = ("node -v",)
C = ("cc --version",)
# Programs (a job's own, or one its command line or script runs) and the probes that say which
# toolchain it gets; ``toolchain_programs`` in the config adds programs or replaces their probes.
PROGRAM_PROBES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("cargo", "cargo-nextest", "maturin"), RUST),  # cargo runs rustc
    **dict.fromkeys(("rustc", "rustdoc", "rustup"), RUST[:1]),
    **dict.fromkeys(("python", "python3", "pytest", "py.test", "pip", "pip3", "tox", "nox", "uv",
                     "poetry", "hatch"), PYTHON),
    **dict.fromkeys(("node", "npm", "npx", "yarn", "pnpm", "bun", "deno"), NODE),
    "go": ("go version",),
    **dict.fromkeys(("make", "gmake", "cc", "gcc", "g++", "c++", "clang", "clang++", "cmake", "ninja",
                     "meson", "ctest"), C),
    **dict.fromkeys(("java", "javac", "mvn", "gradle"), ("java -version",)),
}
SHELLS = frozenset(("sh", "bash", "dash", "zsh", "ksh"))
SCRIPT_LIMIT = 256 << 10  # a script larger than this is not read for the programs it calls
# What selects rustup's toolchain besides its settings: the environment and a file in the tree.
SELECTOR_ENV = ("RUSTUP_TOOLCHAIN", "RUSTUP_HOME", "CARGO_HOME")
SELECTOR_FILES = ("rust-toolchain", "rust-toolchain.toml")
SEED_LIMIT = 64 << 10  # a toolchain file is a few lines: larger ones are not seeded
CACHE_ENTRIES = 64  # (probe, directory) pairs kept; the oldest written is dropped first


def _program(word: str) -> str | None:
    """``python3`` for a versioned interpreter (``python3.11``), else None."""
    name = os.path.basename(word)
    return "python3" if name.startswith("python3.") and name[8:].isdigit() else None


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: plain words will do for finding program names
        return text.split()


def _script_words(path: str) -> list[str]:
    """The words of a script file (a regular file of at most ``SCRIPT_LIMIT``), else none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > SCRIPT_LIMIT:
            return []
        data = os.read(fd, SCRIPT_LIMIT)
    except OSError:
        return []
    finally:
        os.close(fd)
    if b"\0" in data[:4096]:
        return []  # a binary
    return [w for line in data.decode(errors="replace").splitlines() for w in _words(line)]


def probes_for(argv: Sequence[str], cwd: str,
               extra: tuple[str, ...] | list[str] = (),
               programs: Mapping[str, tuple[str, ...]] | None = None) -> list[str]:
    """The probes a job needs: those of every known program among its words — its own program, the
    words of a ``sh -c`` command line, and the words of a script it names that exists under ``cwd``
    (``./build.sh``, ``bash ci.sh``, ``python3 tool.py``) — then ``extra`` (``toolchain_probes``:
    always compared). ``programs`` (``toolchain_programs``) adds to or replaces the built-in table.
    Scanning words rather than command positions can only add probes, never miss one."""
    own = dict(programs or {})
    table = {**PROGRAM_PROBES, **own}
    words: list[str] = []
    scripts = 0
    for i, word in enumerate(argv):
        words.append(word)
        if i > 0 and argv[i - 1] == "-c" and os.path.basename(argv[0]) in SHELLS:
            words += _words(word)
        elif scripts < 2 and ("/" in word or i <= 1) and not word.startswith("-"):
            path = word if os.path.isabs(word) else os.path.join(cwd, word)
            inside = _script_words(path) if os.path.isfile(path) else []
            if inside:
                scripts += 1
                words += inside
    probes: list[str] = []
    for word in words:
        name = os.path.basename(word)
        found = table.get(name)
        configured = own.get(name, own.get("python3") if _program(word) else None)
        if configured is not None:
            found = configured  # the user's table wins, for an interpreter too
        elif name in ("python", "python3") or _program(word) == "python3":
            # The interpreter named is the one to compare: python3.11, or a path (a virtualenv's).
            found = (f"{word if '/' in word else name} -V",)
        for probe in found or ():
            if probe not in probes:
                probes.append(probe)
    for probe in extra:
        if probe not in probes:
            probes.append(probe)
    return probes


def _digest(path: str) -> str:
    """A short hash of a regular file's content (a FIFO in a tree is not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"<{exc.errno}>"
    try:
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return "<not a file>"
            return short_hash(fh.read(), 16)
    except OSError as exc:
        return f"<{exc.errno}>"


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _key(binary: str, cwd: str, env: Mapping[str, str]) -> str:
    """Everything that decides what the probe prints, short of running it: the program file (real
    path, size, mtime), the directory, rustup's environment variables, the nearest
    ``rust-toolchain``/``rust-toolchain.toml`` walking up from the directory (content), rustup's
    ``settings.toml`` (content: default toolchain and directory overrides) and its installed
    toolchains (names and the mtimes of each one's directory and ``bin/``)."""
    st = os.stat(binary)
    parts = [f"{os.path.realpath(binary)}:{st.st_size}:{st.st_mtime_ns}", f"cwd={cwd}"]
    parts += [f"{name}={env.get(name)!r}" for name in SELECTOR_ENV]
    directory = cwd
    while True:
        found = [name for name in SELECTOR_FILES if os.path.exists(os.path.join(directory, name))]
        if found:
            parts += [f"{directory}/{name}:{_digest(os.path.join(directory, name))}" for name in found]
            break
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    from dispatch.core.configpath import user_home

    home = env.get("RUSTUP_HOME") or os.path.join(user_home(env), ".rustup")
    parts.append(f"settings={_digest(os.path.join(home, 'settings.toml'))}")
    toolchains = os.path.join(home, "toolchains")
    try:
        names = sorted(os.listdir(toolchains))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(toolchains, name)
        parts.append(f"{name}:{_mtime(path)}:{_mtime(os.path.join(path, 'bin'))}")
    return "\n".join(parts)


def probe_here(probes: list[str], cache_dir: str, cwd: str | None = None,
               env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Run each probe on this machine in ``cwd`` (default: the current directory), or take its
    cached output when nothing that selects the toolchain changed."""
    cwd = os.path.realpath(cwd or os.getcwd())
    env = os.environ if env is None else env
    cache_path = os.path.join(cache_dir, "toolchain-probes.json")
    cache = _read_cache(cache_dir, cache_path)
    results: dict[str, dict[str, Any]] = {}
    changed = False
    for probe in probes:
        argv = shlex.split(probe)
        binary = which(argv[0], path=env.get("PATH")) if argv else None
        if binary is None:
            results[probe] = {"found": False, "output": None}
            continue
        slot = short_hash(f"{probe}\0{cwd}".encode(), 16)
        try:
            key = _key(binary, cwd, env)
        except OSError:  # the program vanished meanwhile: run it (and say so), cache nothing
            key = ""
        cached = cache.get(slot)
        if key and isinstance(cached, dict) and cached.get("key") == key:
            results[probe] = {"found": True, "output": cached.get("output")}
            continue
        try:
            proc = subprocess.run([binary, *argv[1:]], capture_output=True, text=True, cwd=cwd,
                                  env=None if env is os.environ else dict(env),
                                  timeout=PROBE_TIMEOUT, check=False)
            output = (proc.stdout + proc.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            output = f"<probe failed: {exc}>"
        results[probe] = {"found": True, "output": output}
        cache.pop(slot, None)
        if key:
            cache[slot] = {"key": key, "output": output}
            changed = True
    if changed:
        for old in list(cache)[:-CACHE_ENTRIES]:
            del cache[old]
        try:
            os.makedirs(cache_dir, mode=0o700, exist_ok=True)
            if private_dir_ok(cache_dir):
                write_atomic(cache_path, json.dumps(cache).encode())
        except OSError:
            pass
    return results


def _read_cache(cache_dir: str, cache_path: str) -> dict[str, Any]:
    """The cached outputs, only from a private directory and file of ours: an output planted by
    someone else would make a different toolchain pass the check. Anything else reads as empty."""
    if not private_dir_ok(cache_dir):
        return {}
    try:
        fd = os.open(cache_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as fh:
            if not own_file_ok(os.fstat(fh.fileno())):
                return {}
            cache = json.loads(fh.read())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def selector_files(tree: str, rel_cwd: str) -> dict[str, str]:
    """The tree's toolchain files that apply to the job's directory: every regular
    ``rust-toolchain``/``rust-toolchain.toml`` from that directory up to the tree's top, as
    ``{path relative to the tree: base64 of its content}``, for the peer to seed before it probes."""
    found: dict[str, str] = {}
    rel = rel_cwd.strip("/")
    while True:
        for name in SELECTOR_FILES:
            path = os.path.join(tree, rel, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_size <= SEED_LIMIT:
                    found[os.path.join(rel, name)] = base64.b64encode(os.read(fd, SEED_LIMIT)).decode()
            except OSError:
                pass
            finally:
                os.close(fd)
        if not rel:
            return found
        rel = os.path.dirname(rel)


def seed(workdir: str, files: Mapping[str, str]) -> None:
    """Put the controller's toolchain files into the peer's copy of the tree before probing (the sync
    comes after the check; it then writes the same content). Nothing outside ``workdir`` is touched:
    a path that climbs out, or that meets a symbolic link or a non-directory, is skipped."""
    for rel, content in files.items():
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) \
                or parts[-1] not in SELECTOR_FILES:
            continue
        try:
            data = base64.b64decode(content)
            directory = workdir
            for part in parts[:-1]:
                directory = os.path.join(directory, part)
                try:
                    os.mkdir(directory)
                except FileExistsError:
                    pass
                if not os.path.isdir(directory) or os.path.islink(directory):
                    raise NotADirectoryError(directory)
            path = os.path.join(directory, parts[-1])
            if os.path.lexists(path):
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as fh:
                    if fh.read() == data:
                        continue
            write_atomic(path, data, 0o644)
        except (OSError, ValueError):
            continue


def _interpreter_probe(probe: str) -> bool:
    """Whether ``probe`` is the built-in ``-V`` of a Python interpreter (``python3 -V``,
    ``python3.11 -V``, ``.venv/bin/python -V``), whose output is compared to the minor version."""
    words = probe.split(" ")
    name = os.path.basename(words[0])
    return len(words) == 2 and words[1] == "-V" and (name in ("python", "python3")
                                                     or _program(words[0]) == "python3")


def _minor(output: str) -> str:
    """``Python 3.11`` for ``Python 3.11.7`` (or ``3.11.0rc1``); any other output as it is."""
    parts = output.strip().split(" ")
    if len(parts) == 2 and parts[0] == "Python":
        numbers = parts[1].split(".")
        if len(numbers) >= 2 and numbers[0].isdigit() and numbers[1].isdigit():
            return f"Python {numbers[0]}.{numbers[1]}"
    return output


def compare(local: dict[str, dict[str, Any]], remote: dict[str, dict[str, Any]], peer: str) -> list[str]:
    """The differences, one line each ("" when the toolchains agree).

    A Python interpreter's version is compared to the minor version (3.11.7 here and 3.11.2 there
    agree): patch releases keep the bytecode format, the C ABI and the wheel tags, so a job's
    results do not depend on them, while a minor release changes all three. A stricter check is one
    ``toolchain_probes`` entry away (``python3 -c "import sys; print(sys.version)"``)."""
    lines: list[str] = []
    for probe in local:
        mine, theirs = local[probe], remote.get(probe, {"found": False, "output": None})
        if not mine["found"] and not theirs["found"]:
            continue
        if mine["found"] != theirs["found"]:
            where = "here" if mine["found"] else peer
            lines.append(f"{probe}: found only {where}")
            continue
        ours = (mine["output"] or "").splitlines()
        others = (theirs["output"] or "").splitlines()
        same = _minor if _interpreter_probe(probe) else str
        for i in range(max(len(ours), len(others))):
            a = ours[i] if i < len(ours) else "<nothing>"
            b = others[i] if i < len(others) else "<nothing>"
            if same(a) != same(b):
                lines.append(f"{probe}: here {a!r} / {peer} {b!r}")
    return lines
