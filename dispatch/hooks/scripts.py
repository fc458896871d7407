"""Shells, Python and scripts: what a command that runs other commands from a file or a string runs.

``shell`` reads ``bash -c STRING``, ``eval``, ``source FILE``, ``bash FILE`` and a shell fed its
commands on stdin; ``python`` judges ``python -m MODULE`` as MODULE; ``script`` reads a script named by
path (once per decision, within the depth, size and time limits; binaries, sources of other
languages and other interpreters' scripts are left to the patterns). The commands found are judged
by calling back into the walk through the ``Context``. ``classify`` imports this module only when a
command needs it: a light command's path does not load it.
"""

from __future__ import annotations

import os
import stat

from dispatch.hooks import rules
from dispatch.hooks.classifystate import SHELLS, at, inside, is_python, shown

MYPY = False
if MYPY:
    from dispatch.hooks.classifystate import Context, Site
    from dispatch.hooks.shellwords import Simple

SHELL_EXTENSIONS = frozenset(("", ".sh", ".bash", ".zsh", ".ksh", ".dash", ".bats", ".command"))


def shell(ctx: Context, name: str, words: list[str], site: Site, cmd: Simple | None,
          piped: Simple | None) -> None:
    """A shell or its builtins that run commands: ``eval``, ``source F``, ``bash -c S``, ``bash F``,
    and a shell that reads its commands from a here-doc or from ``echo``/``printf``/``cat`` piped in."""
    if name == "eval":
        ctx.text(" ".join(words[1:]), inside(site, "eval"))
        return
    if name in ("source", "."):
        if len(words) > 1:
            script(ctx, words[1], words[2:], site, False, True)
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
            ctx.text(words[i], inside(site, f"{name} -c"))
        return
    if i < len(words):
        script(ctx, words[i], words[i + 1 :], site, False, True)
        return
    stdin = cmd.stdin_text if cmd is not None else None
    if stdin is None and piped is not None:
        producer = rules.tool_name(piped.words[0]) if piped.words else ""
        if producer in ("echo", "printf"):
            stdin = " ".join(piped.words[1:])
        else:
            stdin = piped.stdin_text if producer == "cat" else None
    if stdin is not None:
        ctx.text(stdin, inside(site, f"{name}'s input"))
        return
    ctx.found(False, False, f"{name} [a shell reading what it is given]{at(site)}", site.through)


def python(ctx: Context, words: list[str], site: Site, gpu_env: bool) -> bool:
    """``python -m MODULE …`` is judged as ``MODULE …`` (``-m dispatch`` is hostrun), falling back to the
    python rules; everything else goes to the patterns (``python train.py``)."""
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-W", "-X"):
            i += 2
        elif word == "-c":  # the code is not a script name: judge `python -c` alone
            ctx.decide([words[0], "-c"], site, gpu_env, read_script=False)
            return True
        elif word == "-m" or (word.startswith("-m") and len(word) > 2):
            module = words[i + 1] if word == "-m" and i + 1 < len(words) else word[2:]
            rest = words[i + 2 :] if word == "-m" else words[i + 1 :]
            if not module:
                return False
            if module == "dispatch":
                ctx.hostrun(rest, site, gpu_env)
                return True
            if rules.best_match([module, *rest], ctx.table) is not None:
                ctx.decide([module, *rest], site, gpu_env, read_script=False)
                return True
            ctx.decide([words[0], module, *rest], site, gpu_env, read_script=False)
            return True
        elif len(word) > 1 and word[0] == "-" and word != "--":
            i += 1
        else:
            break
    ctx.decide(words, site, gpu_env, read_script=False)
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


def script(ctx: Context, word: str, args: list[str], site: Site, gpu_env: bool,
           as_shell: bool) -> bool:
    """Read the script ``word`` names (a path as written, relative to the site's directory) and
    judge its commands. ``as_shell``: a shell runs it (``bash f``, ``source f``), so its shebang does
    not matter. False when it is not a script to read (the caller decides by name then)."""
    if "$" in word or "`" in word:
        ctx.give_up(f"{shown([word, *args])} names a script only known when it runs", site)
        return True
    if word.startswith("~/") and ctx.env.get("HOME"):
        word_path = ctx.env["HOME"] + word[1:]
    else:
        word_path = word
    path = os.path.join(site.cwd, word_path)
    written = ctx.written.get(os.path.normpath(path))
    if written is not None:  # written earlier in this very line: judge what was written
        if site.depth >= ctx.max_depth:
            ctx.give_up(f"{word}: scripts nested deeper than {ctx.max_depth}", site)
            return True
        ctx.written.pop(os.path.normpath(path))  # once: a script that runs itself is read once
        ctx.text(written, site.child(), line_base=f"{word} (written in this command)")
        return True
    try:
        st = os.stat(path)
    except OSError:
        ctx.found(False, False, f"{word} [not found: nothing runs]{at(site)}", site.through)
        return True
    if not stat.S_ISREG(st.st_mode):
        return False
    extension = os.path.splitext(os.path.basename(word))[1].lower()
    if extension == ".py":
        ctx.decide(["python3", word, *args], site, gpu_env, read_script=False)
        return True
    if extension in _NOT_SHELL:
        ctx.found(False, False, f"{word} [a {extension} file is not read as a script]{at(site)}",
                  site.through)
        return True
    real = os.path.realpath(path)
    if real in ctx.seen:
        return True  # already judged in this decision (a script that sources itself, or a loop)
    if st.st_size > ctx.max_bytes:
        ctx.give_up(f"{word} is too big to read ({st.st_size // 1024} KiB > {ctx.max_bytes // 1024} KiB)",
                    site)
        return True
    if site.depth >= ctx.max_depth:
        ctx.give_up(f"{word}: scripts nested deeper than {ctx.max_depth}", site)
        return True
    if ctx.late(site):
        return True
    try:
        with open(path, "rb") as fh:
            data = fh.read(ctx.max_bytes + 1)
    except OSError as exc:
        ctx.give_up(f"{word} cannot be read ({exc.strerror})", site)
        return True
    if b"\0" in data[:8192]:
        return False  # a binary: judged by its name
    text = data.decode("utf-8", "replace")
    interpreter = _interpreter(text[:256].partition("\n")[0])
    if not as_shell and interpreter is not None and interpreter not in SHELLS:
        if is_python(interpreter):
            ctx.decide(["python3", word, *args], site, gpu_env, read_script=False)
            return True
        return False  # node, perl, …: judged by its name
    if not as_shell and interpreter is None and extension not in SHELL_EXTENSIONS:
        return False
    ctx.seen.add(real)
    ctx.text(text, site.child(), line_base=word)
    return True

