"""The state of a synced tree, on both sides of ``hostrun --peer``: a stat walk (path, kind, size,
mtime_ns, mode, owner, link target) of what the sync manages, and the private files that keep it
(docs/peers.md, "The peer's copy of your tree"). Standard library only (shipped).

Why a walk of our own and not rsync's: rsync's walk of the whole tree is most of a peer run's cost
when nothing changed. The controller walks its tree and the agent its copy, in parallel in the one
session; rsync is skipped only when both are unchanged since the last sync (docs/peers.md).

What is walked must never be less than what rsync syncs, or a change could be missed; it may be
more (a spurious full sync is only slower). So only the plainest exclude patterns are honoured (a
name with ``*``/``?``, optionally anchored with a leading ``/`` or marked a directory with a
trailing ``/``: the same in rsync's and git's syntax); any other pattern excludes nothing, and a
``!`` line in a ``.gitignore`` (rsync: clear the list) turns every ``.gitignore`` rule off.

Why it is cheap: a walk keeps each directory's listing (what it kept of it under the rules in force)
with the directory's inode, ctime and mtime, and the next walk reads a directory again only when
one of those or its rules changed. Creating, deleting or renaming an entry changes the directory's
ctime, which nothing can set back; a listing read less than ``RACY_NS`` after its directory last
changed is not kept (a change in the same clock tick would leave the ctime as it was). Every file
is still ``lstat``-ed: an edit in place changes no directory.
"""

from __future__ import annotations

import os
import stat
import time

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.agent.prepareshape import CopyState, GoToken, ManifestHeader

    Entry = tuple[Any, ...]
    # per directory ("" the top, else "a/b/"): its own entry, and its names: None for a directory
    # below (its own entry is under its name), the entry of anything else
    Content = dict[str, tuple[Entry, dict[str, "Entry | None"]]]
    # per directory: (inode, ctime_ns, mtime_ns, has a .gitignore, the rules key) of its listing
    Listings = dict[str, tuple[Any, ...]]
    Rule = tuple[bool, str]  # (directories only, name glob)

GITIGNORE = ".gitignore"
MANIFEST = ".hostrun-manifest"  # in the peer's copy, top level: never synced, never deleted
# The peer's own files at the top of its copy (owner record, locks, this manifest): never synced.
TOP_EXCLUDES = ("/.git/", "/.hostrun-owner*", "/.hostrun-lock*", f"/{MANIFEST}*")
VERSION = 3
RACY_NS = 2_000_000_000  # a listing or .gitignore younger than this is read again next time
_MAGIC = b"hostrun-tree-state\n"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Walk:
    """One walk: ``content`` (what the sync manages, per directory), ``ignores`` (each
    ``.gitignore`` read: its stat key, contents and parsed rules), ``exact`` (every rule understood:
    only then may a sync of listed paths stand in for the full one, as rsync's ``--files-from``
    reads no ``.gitignore``), ``plain`` (the ``.gitignore`` rules were followed), ``listings``
    (what a later walk needs to reuse a directory's names) and ``fresh`` (listings kept now that
    the walk it started from did not have)."""

    __slots__ = ("content", "exact", "fresh", "ignores", "listings", "plain")

    def __init__(self, content: Content, listings: Listings, ignores: dict[str, tuple[Any, ...]],
                 exact: bool, plain: bool = True) -> None:
        self.content = content
        self.listings = listings
        self.ignores = ignores
        self.exact = exact
        self.plain = plain
        self.fresh = 0

    def same_as(self, other: Walk) -> bool:
        """Whether a sync of this tree would find what ``other`` found: the same entries and the
        same ``.gitignore`` contents."""
        return self.content == other.content and self.exact == other.exact \
            and self.plain == other.plain \
            and {k: v[1] for k, v in self.ignores.items()} == {k: v[1] for k, v in other.ignores.items()}

    def entries(self) -> dict[str, Entry]:
        """Every path's entry, flat (the top directory's own is not one)."""
        flat: dict[str, Entry] = {}
        for rel, (entry, names) in self.content.items():
            if rel:
                flat[rel[:-1]] = entry
            for name, value in names.items():
                if value is not None:
                    flat[rel + name] = value
        return flat


def _rule(pattern: str) -> tuple[bool, bool, str] | None:
    """(anchored, directories only, name glob) for a pattern this walk understands, else None."""
    anchored = pattern.startswith("/")
    dir_only = pattern.endswith("/")
    name = pattern[1 if anchored else 0:len(pattern) - (1 if dir_only else 0)]
    if not name or "/" in name or "[" in name or "\\" in name or name != name.strip() \
            or any(ch.isspace() for ch in name) or name in (".", ".."):
        return None
    return anchored, dir_only, name


_COMPILED: dict[tuple[Rule, ...], Any] = {}


class _Rules:
    """Exclude rules in force in one directory: inherited unanchored ones plus its own, compiled
    into one regular expression for any entry and one for directories (once per set of rules)."""

    def __init__(self, inherited: list[Rule], here: list[Rule]) -> None:
        self.key = key = tuple(sorted(set(here + inherited)))
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


def _parse_ignore(data: bytes) -> tuple[list[Rule], list[Rule], bool, bool]:
    """A ``.gitignore``'s rules: (anchored, loose, every rule understood, has a ``!`` line)."""
    anchored: list[Rule] = []
    loose: list[Rule] = []
    exact = True
    bang = False
    for raw in data.decode("utf-8", "replace").split("\n"):
        line = raw.rstrip("\r")
        if not line or line[0] in "#;":
            continue
        if line.startswith("!"):
            bang = True
            continue
        rule = _rule(line)
        if rule is None:
            exact = False
        else:
            (anchored if rule[0] else loose).append((rule[1], rule[2]))
    return anchored, loose, exact, bang


class _Walker:
    """One walk with the ``.gitignore`` rules, reusing ``before``'s listings where still valid."""

    def __init__(self, root: str, before: Walk | None) -> None:
        self.root = root
        usable = before is not None and before.plain
        self.old_listings: Listings = before.listings if before is not None and usable else {}
        self.old_content: Content = before.content if before is not None and usable else {}
        self.old_ignores = before.ignores if before is not None else {}
        self.limit = time.time_ns() - RACY_NS  # a change before this is safely in a ctime
        self.walk = Walk({}, {}, {}, True)

    def gitignore(self, fd: int, rel: str) -> tuple[list[Rule], list[Rule]]:
        """This directory's ``.gitignore`` rules, read again only when its stat key changed."""
        st = os.stat(GITIGNORE, dir_fd=fd, follow_symlinks=False)
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        rel_gi = rel + GITIGNORE
        old = self.old_ignores.get(rel_gi)
        if old is not None and old[0] == key:
            known = old
        else:
            try:
                ifd = os.open(GITIGNORE, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
                with os.fdopen(ifd, "rb") as fh:
                    data = fh.read()
            except OSError:
                data = b"\0unreadable"
            known = (key if st.st_ctime_ns < self.limit else None, data, *_parse_ignore(data))
        self.walk.ignores[rel_gi] = known
        if not known[4]:
            self.walk.exact = False
        if known[5]:
            self.walk.plain = False
        return known[2], known[3]

    def directory(self, path: str, rel: str, inherited: list[Rule], here: list[Rule]
                  ) -> list[tuple[str, str, list[Rule], list[Rule]]]:
        """One directory: its entry, its files' entries; the directories below it to walk."""
        fd = os.open(path, _DIR_FLAGS if rel else _DIR_FLAGS & ~os.O_NOFOLLOW)  # the top may be a link
        try:
            st = os.fstat(fd)
            listing = (st.st_ino, st.st_ctime_ns, st.st_mtime_ns)
            cached = self.old_listings.get(rel) or ()
            valid = cached[:3] == listing and rel in self.old_content
            items = None
            if valid:
                has_gi = cached[3]
            else:
                items = _listing(fd)
                has_gi = any(name == GITIGNORE for name, _ in items)
            if has_gi:
                anchored, loose = self.gitignore(fd, rel)
                here = [*here, *anchored]
                inherited = [*inherited, *loose]
            rules = _Rules(inherited, here)
            if valid and cached[4] == rules.key:
                kept = [(name, value is None) for name, value in self.old_content[rel][1].items()]
            else:
                valid = False
                kept = _kept(items if items is not None else _listing(fd), rules)
            if st.st_ctime_ns < self.limit:
                self.walk.listings[rel] = (*listing, has_gi, rules.key)
                if rel and not valid:  # (the top changes with each manifest written there)
                    self.walk.fresh += 1
            names = self.names(fd, kept)
            self.walk.content[rel] = (("d", st.st_mode, st.st_uid, st.st_gid), names)
            return [(f"{path}/{name}", f"{rel}{name}/", inherited, [])
                    for name, value in names.items() if value is None]
        finally:
            os.close(fd)

    @staticmethod
    def names(fd: int, kept: list[tuple[str, bool]]) -> dict[str, Entry | None]:
        """Each kept name's entry (None for a directory: walked on its own)."""
        lstat = os.lstat
        names: dict[str, Entry | None] = {}
        for name, is_dir in kept:
            if is_dir:
                names[name] = None
                continue
            st = lstat(name, dir_fd=fd)
            mode = st.st_mode
            if stat.S_ISREG(mode):
                names[name] = ("f", st.st_size, st.st_mtime_ns, mode, st.st_uid, st.st_gid)
            elif stat.S_ISLNK(mode):
                names[name] = ("l", os.readlink(name, dir_fd=fd), st.st_uid, st.st_gid)
            else:
                names[name] = ("o", mode, st.st_uid, st.st_gid)
        return names


def _listing(fd: int) -> list[tuple[str, bool]]:
    """A directory's names, and whether each is a directory (``d_type``: no stat)."""
    with os.scandir(fd) as it:
        return [(item.name, item.is_dir(follow_symlinks=False)) for item in it]


def _kept(items: list[tuple[str, bool]], rules: _Rules) -> list[tuple[str, bool]]:
    """The names of a listing the rules do not exclude (a ``.gitignore`` file is always kept)."""
    match_any, match_dir = rules.any, rules.dirs
    kept = []
    for name, is_dir in items:
        if is_dir:
            if match_dir is not None and match_dir(name) is not None:
                continue
        elif match_any is not None and name != GITIGNORE and match_any(name) is not None:
            continue
        kept.append((name, is_dir))
    return kept


def walk(root: str, patterns: list[str] | tuple[str, ...] = (), before: Walk | None = None
         ) -> Walk | None:
    """The entries under ``root`` that a sync with the top excludes, ``patterns`` (rsync
    ``--exclude``) and the tree's ``.gitignore`` files would manage; ``before``, an earlier walk of
    the same root with the same patterns, lends its listings of unchanged directories. None when
    any directory cannot be read: then nothing is known."""
    top: list[Rule] = []
    anywhere: list[Rule] = []
    exact = True
    for pattern in (*TOP_EXCLUDES, *patterns):
        rule = _rule(pattern)
        if rule is None:
            exact = False
        else:
            (top if rule[0] else anywhere).append((rule[1], rule[2]))
    walker = _Walker(root.rstrip("/") or "/", before)
    try:
        stack = [(walker.root, "", anywhere, top)]
        while stack:
            stack.extend(walker.directory(*stack.pop()))
    except OSError:
        return None
    result = walker.walk
    result.exact = result.exact and exact
    if not result.plain:  # a "!" line: this walk cannot follow rsync there; walk it all
        return _walk_all(root, top, anywhere, result.ignores)
    return result


def _walk_all(root: str, top: list[Rule], anywhere: list[Rule],
              ignores: dict[str, tuple[Any, ...]]) -> Walk | None:
    """The walk with no ``.gitignore`` rule at all (only the top excludes and ``--exclude``s)."""
    content: Content = {}
    try:
        stack = [(root, "", _Rules(anywhere, top))]
        while stack:
            path, rel, rules = stack.pop()
            names: dict[str, Entry | None] = {}
            content[rel] = (_entry(path, os.lstat(path)), names)
            with os.scandir(path) as it:
                for item in it:
                    st = item.stat(follow_symlinks=False)
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if rules.excludes(item.name, is_dir):
                        continue
                    if is_dir:
                        names[item.name] = None
                        stack.append((item.path, f"{rel}{item.name}/", _Rules(anywhere, [])))
                    else:
                        names[item.name] = _entry(item.path, st)
    except OSError:
        return None
    return Walk(content, {}, ignores, False, plain=False)


def _entry(path: str, st: os.stat_result) -> tuple[Any, ...]:
    """What a walk keeps of one path: a directory's mode and owner; a regular file's size, mtime,
    mode and owner; a link's target and owner; anything else's mode and owner."""
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return ("d", mode, st.st_uid, st.st_gid)
    if stat.S_ISREG(mode):
        return ("f", st.st_size, st.st_mtime_ns, mode, st.st_uid, st.st_gid)
    if stat.S_ISLNK(mode):
        return ("l", os.readlink(path), st.st_uid, st.st_gid)
    return ("o", mode, st.st_uid, st.st_gid)


def entry_of(root: str, rel: str) -> tuple[Any, ...] | None:
    """One path's entry as ``walk`` records it (None: it is not there)."""
    path = os.path.join(root, rel)
    try:
        return _entry(path, os.lstat(path))
    except OSError:
        return None


def dumps(header: ManifestHeader, walked: Walk) -> bytes:
    """A walk and its header (the sync's token, ...) as a state file's bytes: marshal, tagged with
    this Python's version (another one may not read it; then it is no state)."""
    import marshal
    import sys

    state = {"header": header, "content": walked.content, "listings": walked.listings,
             "ignores": walked.ignores, "exact": walked.exact, "plain": walked.plain}
    tag = f"{VERSION} {sys.version_info[0]}.{sys.version_info[1]}\n".encode()
    return _MAGIC + tag + marshal.dumps(state)


def loads(data: bytes | None) -> tuple[ManifestHeader, Walk] | None:
    """``dumps``' header and walk; None for anything else (another version, damage)."""
    import marshal
    import sys

    if data is None or not data.startswith(_MAGIC):
        return None
    tag, _, body = data[len(_MAGIC):].partition(b"\n")
    if tag != f"{VERSION} {sys.version_info[0]}.{sys.version_info[1]}".encode():
        return None
    try:
        state = marshal.loads(body)
        parts = (state["header"], state["content"], state["listings"], state["ignores"])
        if not all(isinstance(part, dict) for part in parts):
            return None
        return parts[0], Walk(parts[1], parts[2], parts[3], bool(state["exact"]),
                              bool(state["plain"]))
    except (ValueError, EOFError, TypeError, KeyError):
        return None


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

def check_copy(workdir: str, patterns: list[str]) -> tuple[CopyState, Walk | None]:
    """Whether the copy is as the last sync left it: ``{"token": T, "clean": bool}`` for the P
    frame (token None without a usable manifest), and the walk (kept for ``save_after_go``)."""
    loaded = loads(read_private(os.path.join(workdir, MANIFEST)))
    token = loaded[0].get("token") if loaded is not None else None
    if loaded is None or not isinstance(token, str) or not token:
        return {"token": None, "clean": False}, None
    walked = walk(workdir, patterns, loaded[1])
    return {"token": token, "clean": walked is not None and walked.same_as(loaded[1])}, walked


def keep_listings(workdir: str, copy: CopyState, walked: Walk | None) -> None:
    """After a clean check that read directories again: the same manifest with their listings, so
    that the next check need not read them (written while the controller decides, or the job runs:
    the walk was taken before)."""
    if walked is not None and copy.get("clean") and walked.fresh:
        write_manifest(workdir, str(copy["token"]), walked)


def state_after_go(workdir: str, patterns: list[str], walked: Walk | None,
                   go: GoToken) -> tuple[str, Walk] | None:
    """The copy as the controller's go left it, taken before the job runs: after a full sync a
    fresh walk; after a sync of known paths (the copy was clean) the prepare walk with those paths
    re-read; after no sync, None (nothing to record). Any failure removes the manifest (the next
    run then syncs in full) and is None."""
    token = go.get("token")
    if not token:
        return None
    try:
        paths = go.get("paths")
        if paths is not None and walked is not None:
            content = dict(walked.content)
            for rel in paths:  # a path not in the walk: KeyError below, no manifest
                parent, _, name = str(rel).rpartition("/")
                own, names = content[f"{parent}/" if parent else ""]  # KeyError: no manifest
                names = dict(names)
                entry = entry_of(workdir, str(rel))
                if entry is None:
                    names.pop(name, None)
                else:
                    names[name] = entry
                content[f"{parent}/" if parent else ""] = (own, names)
            # No .gitignore among the paths (the controller sends none): the rules read stand;
            # the directories rsync wrote in have a new ctime, so the next walk reads them again.
            fresh: Walk | None = Walk(content, walked.listings, walked.ignores, walked.exact,
                                      walked.plain)
        else:
            fresh = walk(workdir, patterns, walked)
        if fresh is None:
            raise OSError("the copy could not be walked")
        return str(token), fresh
    except Exception:  # no manifest rather than a wrong one: the next run then syncs in full
        _forget_manifest(workdir)
        return None


def save_after_go(workdir: str, patterns: list[str], walked: Walk | None,
                  go: GoToken) -> None:
    """``state_after_go`` written as the manifest (the agent writes it while the job runs)."""
    state = state_after_go(workdir, patterns, walked, go)
    if state is not None:
        write_manifest(workdir, *state)


def write_manifest(workdir: str, token: str, walked: Walk) -> None:
    """The manifest of the copy; a failure leaves none (the next run then syncs in full)."""
    try:
        top = os.stat(workdir)
        write_private(os.path.join(workdir, MANIFEST), dumps({"token": token}, walked))
        # The copy's top directory keeps the time rsync gave it (as the tree's): an rsync by hand
        # to check the copy then finds nothing to do.
        os.utime(workdir, ns=(top.st_atime_ns, top.st_mtime_ns))
    except Exception:
        _forget_manifest(workdir)


def _forget_manifest(workdir: str) -> None:
    try:
        os.unlink(os.path.join(workdir, MANIFEST))
    except OSError:
        pass
