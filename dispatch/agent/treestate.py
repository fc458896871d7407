"""The state of a synced tree, on both sides of ``hostrun --peer``: a stat walk (path, kind, size,
mtime_ns, mode, link target) of what the sync manages, its digest, and the private files that keep
it (docs/peers.md, "The peer's copy of your tree"). Standard library only (shipped).

Why a walk of our own and not rsync's: rsync's walk of the whole tree is most of a peer run's cost
when nothing changed. The controller walks its tree and the agent its copy, in parallel in the one
session; rsync is skipped only when both are unchanged since the last sync (docs/peers.md).

What is walked must never be less than what rsync syncs, or a change could be missed; it may be
more (a spurious full sync is only slower). So only the plainest exclude patterns are honoured (a
name with ``*``/``?``, optionally anchored with a leading ``/`` or marked a directory with a
trailing ``/``: the same in rsync's and git's syntax); any other pattern excludes nothing, and a
``!`` line in a ``.gitignore`` (rsync: clear the list) turns every ``.gitignore`` rule off.
"""

from __future__ import annotations

import os
import stat

MYPY = False
if MYPY:
    from typing import Any

    Entries = dict[str, tuple[Any, ...]]
    # entries, digest, the .gitignore contents read, whether every rule was understood (only then
    # may a sync of listed paths stand in for the full one: rsync's --files-from reads no .gitignore)
    Walked = tuple[Entries, str, list[str], bool]

GITIGNORE = ".gitignore"
MANIFEST = ".hostrun-manifest"  # in the peer's copy, top level: never synced, never deleted
# The peer's own files at the top of its copy (owner record, locks, this manifest): never synced.
TOP_EXCLUDES = ("/.git/", "/.hostrun-owner*", "/.hostrun-lock*", f"/{MANIFEST}*")
VERSION = 1


def _rule(pattern: str) -> tuple[bool, bool, str] | None:
    """(anchored, directories only, name glob) for a pattern this walk understands, else None."""
    anchored = pattern.startswith("/")
    dir_only = pattern.endswith("/")
    name = pattern[1 if anchored else 0:len(pattern) - (1 if dir_only else 0)]
    if not name or "/" in name or "[" in name or "\\" in name or name != name.strip() \
            or any(ch.isspace() for ch in name) or name in (".", ".."):
        return None
    return anchored, dir_only, name


_COMPILED: dict[tuple[tuple[bool, str], ...], Any] = {}


class _Rules:
    """Exclude rules in force in one directory: inherited unanchored ones plus its own, compiled
    into one regular expression for any entry and one for directories (once per set of rules)."""

    def __init__(self, inherited: list[tuple[bool, str]], here: list[tuple[bool, str]]) -> None:
        self.inherited = inherited  # (dir only, glob), unanchored: apply at every depth below
        self.here = here  # (dir only, glob): apply to this directory's entries only
        key = tuple(sorted(set(here + inherited)))
        compiled = _COMPILED.get(key)
        if compiled is None:
            compiled = _COMPILED[key] = (_compile([g for d, g in key if not d]),
                                         _compile([g for _, g in key]))
        self.any, self.dirs = compiled

    def excludes(self, name: str, is_dir: bool) -> bool:
        match = self.dirs if is_dir else self.any
        return match is not None and match(name) is not None


def _compile(globs: list[str]) -> Any:
    if not globs:
        return None
    import re
    from fnmatch import translate

    return re.compile("|".join(f"(?:{translate(glob)})" for glob in globs)).match


def walk(root: str, patterns: list[str] | tuple[str, ...] = ()) -> Walked | None:
    """The entries under ``root`` that a sync with the top excludes, ``patterns`` (rsync
    ``--exclude``) and the tree's ``.gitignore`` files would manage, and their digest (which
    covers every ``.gitignore`` read, so a changed rule is a change). None when any directory
    cannot be read: then nothing is known."""
    top: list[tuple[bool, str]] = []
    anywhere: list[tuple[bool, str]] = []
    exact = [True]
    for pattern in (*TOP_EXCLUDES, *patterns):
        rule = _rule(pattern)
        if rule is None:
            exact[0] = False
        else:
            (top if rule[0] else anywhere).append((rule[1], rule[2]))
    entries: Entries = {}
    ignores: list[str] = []
    use_gitignore = [True]

    def gitignore_rules(path: str, rel: str) -> tuple[list[tuple[bool, str]], list[tuple[bool, str]]]:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            data = b"\0unreadable"
        ignores.append(f"{rel}\0{data.hex()}")
        anchored: list[tuple[bool, str]] = []
        loose: list[tuple[bool, str]] = []
        for raw in data.decode("utf-8", "replace").split("\n"):
            line = raw.rstrip("\r")
            if not line or line[0] in "#;":
                continue
            if line.startswith("!"):
                use_gitignore[0] = False
                continue
            rule = _rule(line)
            if rule is None:
                exact[0] = False
            else:
                (anchored if rule[0] else loose).append((rule[1], rule[2]))
        return anchored, loose

    try:
        stack: list[tuple[str, str, list[tuple[bool, str]], list[tuple[bool, str]]]] = [
            (root, "", anywhere, top)]
        while stack:
            path, rel, inherited, here = stack.pop()
            with os.scandir(path) as it:
                items = list(it)
            names = {item.name for item in items}
            if GITIGNORE in names:
                anchored, loose = gitignore_rules(os.path.join(path, GITIGNORE),
                                                  f"{rel}{GITIGNORE}")
                here = [*here, *anchored]
                inherited = [*inherited, *loose]
            rules = _Rules(inherited, here)
            match_any, match_dir = rules.any, rules.dirs  # hot loop: no method calls per entry
            for item in items:
                name = item.name
                if item.is_dir(follow_symlinks=False):  # d_type: no stat for a directory
                    if match_dir is not None and match_dir(name) is not None:
                        continue
                    key = rel + name
                    entries[key] = ("d",)
                    stack.append((item.path, key + "/", inherited, []))
                    continue
                if match_any is not None and name != GITIGNORE and match_any(name) is not None:
                    continue
                entries[rel + name] = _entry(item.path, item.stat(follow_symlinks=False))
    except OSError:
        return None
    if not use_gitignore[0]:  # a "!" line: this walk cannot follow rsync there; walk it all
        return _walk_all(root, top, anywhere, ignores)
    return entries, digest_of(entries, ignores), ignores, exact[0]


def _walk_all(root: str, top: list[tuple[bool, str]], anywhere: list[tuple[bool, str]],
              ignores: list[str]) -> Walked | None:
    """The walk with no ``.gitignore`` rule at all (only the top excludes and ``--exclude``s)."""
    entries: Entries = {}
    try:
        stack = [(root, "", _Rules(anywhere, top))]
        while stack:
            path, rel, rules = stack.pop()
            with os.scandir(path) as it:
                for item in it:
                    st = item.stat(follow_symlinks=False)
                    mode = st.st_mode
                    is_dir = stat.S_ISDIR(mode)
                    if rules.excludes(item.name, is_dir):
                        continue
                    key = rel + item.name
                    if is_dir:
                        entries[key] = ("d",)
                        stack.append((item.path, key + "/", _Rules(anywhere, [])))
                    else:
                        entries[key] = _entry(item.path, st)
    except OSError:
        return None
    ignores = ["!", *ignores]
    return entries, digest_of(entries, ignores), ignores, False


def _entry(path: str, st: os.stat_result) -> tuple[Any, ...]:
    """What a walk keeps of a file that is not a directory: a regular file's size, mtime and mode;
    a link's target; anything else's mode."""
    if stat.S_ISREG(st.st_mode):
        return ("f", st.st_size, st.st_mtime_ns, st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return ("l", os.readlink(path))
    return ("o", st.st_mode)


def digest_of(entries: Entries, ignores: list[str]) -> str:
    """One hash of the sorted entries and the ``.gitignore`` contents read (order-free: a walk's
    order may change without anything changing)."""
    from dispatch.core.fingerprint import sha256  # not hashlib: it loads OpenSSL (~2-3 ms)

    text = "\n".join(f"{key}\0{value!r}" for key, value in sorted(entries.items()))
    return str(sha256("\n".join([text, *sorted(ignores)]).encode("utf-8", "surrogateescape")
                      ).hexdigest())


def entry_of(root: str, rel: str) -> tuple[Any, ...] | None:
    """One path's entry as ``walk`` records it (None: it is not there)."""
    try:
        st = os.lstat(os.path.join(root, rel))
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return ("d",)
    if stat.S_ISREG(st.st_mode):
        return ("f", st.st_size, st.st_mtime_ns, st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return ("l", os.readlink(os.path.join(root, rel)))
    return ("o", st.st_mode)


def read_private(path: str) -> bytes | None:
    """A state file's bytes, only if it is a regular file of ours that no one else may write (a
    foreign or damaged record is no record: the caller falls back to a full sync)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_private(path: str, data: bytes) -> None:
    """Write a state file 0600 (atomically), then check it is ours and private."""
    from dispatch.core.atomicfile import write_atomic

    write_atomic(path, data, 0o600, exact_mode=True)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(1, f"{path}: not a private file of ours after writing it")


# -- the agent's side: the copy checked in the prepare step, its manifest saved after go --

def check_copy(workdir: str, patterns: list[str]) -> tuple[dict[str, Any], Walked | None]:
    """Whether the copy is as the last sync left it: ``{"token": T, "clean": bool}`` for the P
    frame (token None without a usable manifest), and the walk (kept for ``save_after_go``)."""
    import json

    token = None
    saved = None
    data = read_private(os.path.join(workdir, MANIFEST))
    if data is not None:
        try:
            record = json.loads(data)
            if record.get("version") == VERSION:
                token, saved = str(record["token"]), str(record["digest"])
        except (ValueError, KeyError, TypeError, AttributeError):
            token = saved = None
    if token is None:
        return {"token": None, "clean": False}, None
    walked = walk(workdir, patterns)
    return {"token": token, "clean": walked is not None and walked[1] == saved}, walked


def save_after_go(workdir: str, patterns: list[str], walked: Walked | None,
                  go: dict[str, Any]) -> None:
    """Record the copy as the controller's go left it: after a full sync a fresh walk; after a sync
    of known paths (the copy was clean) the prepare walk with those paths re-read; after no sync,
    nothing to do. Any failure removes the manifest (the next run then syncs in full)."""
    import json

    token = go.get("token")
    if not token:
        return
    path = os.path.join(workdir, MANIFEST)
    try:
        if go.get("paths") is not None and walked is not None:
            entries = dict(walked[0])
            for rel in go["paths"]:
                entry = entry_of(workdir, str(rel))
                if entry is None:
                    entries.pop(str(rel), None)
                else:
                    entries[str(rel)] = entry
            # No .gitignore among the paths (the controller sends none): the rules read stand.
            fresh: Walked | None = (entries, digest_of(entries, walked[2]), walked[2], walked[3])
        else:
            fresh = walk(workdir, patterns)
        if fresh is None:
            raise OSError("the copy could not be walked")
        top = os.stat(workdir)
        write_private(path, json.dumps({"version": VERSION, "token": str(token),
                                        "digest": fresh[1]}).encode())
        # The copy's top directory keeps the time rsync gave it (as the tree's): an rsync by hand
        # to check the copy then finds nothing to do.
        os.utime(workdir, ns=(top.st_atime_ns, top.st_mtime_ns))
    except Exception:  # no manifest rather than a wrong one: the next run then syncs in full
        try:
            os.unlink(path)
        except OSError:
            pass

