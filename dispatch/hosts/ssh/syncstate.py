"""Whether ``hostrun --peer`` must rsync: the controller's record of its tree at the last sync to a
peer, and the choice between no sync, a sync of known paths (``--files-from``) and the full rsync
(docs/peers.md, "The peer's copy of your tree").

A job may edit files in the peer's copy, so "nothing changed here" is not "the copy is current":
rsync is skipped only when this tree's walk equals the one recorded at the last successful sync AND
the agent says its copy still matches the manifest it saved then (same token: the same sync). When
only changed or new files here and the copy is clean, only they are sent. Anything else, or any
doubt (no record, a damaged or foreign one, other sync options), is the full rsync.

The record: ``<state_dir>/peer-sync/<host>-<tree id>`` (0600 in a 0700 directory, both checked),
``treestate.dumps`` of the walk (its entries, and the directory listings the next walk reuses)
under a header of the sync's options key and token.
"""

from __future__ import annotations

import os
import stat

from dispatch.agent.treestate import GITIGNORE, Walk, dumps, loads, read_private, write_private

MYPY = False
if MYPY:

    from dispatch.agent.prepareshape import CopyState, ManifestHeader
    from dispatch.agent.treestate import Content

    Loaded = tuple[ManifestHeader, Walk]  # the header, the walk recorded

MAX_PATHS = 1000  # more changed paths than this: the full rsync (its walk is then worth it)
MAX_PATHS_BYTES = 256 << 10  # the paths travel in the go frame (at most 1 MiB): well below it


_NEW = ("new",)  # a name the last sync did not have


def record_path(state_dir: str, host: str, tree: str) -> str:
    """The record's path; its directory created 0700 and checked (ours, private)."""
    directory = os.path.join(state_dir, "peer-sync")
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(1, f"{directory}: not a private directory of ours")
    return os.path.join(directory, f"{host}-{tree}")


def load(path: str) -> Loaded | None:
    """The record's header and walk (read in the walk's thread, before the walk, which reuses its
    listings); None when there is no usable record."""
    return loads(read_private(path))


def plan(loaded: Loaded | None, key: str, walked: Walk | None,
         copy: CopyState | None) -> tuple[str, list[str]]:
    """``("skip", [])``, ``("paths", changed)`` or ``("full", [])``."""
    if walked is None or loaded is None or not isinstance(copy, dict) or not copy.get("clean") \
            or not copy.get("token"):
        return "full", []
    header, before = loaded
    if header.get("key") != key or header.get("token") != copy["token"]:
        return "full", []
    if walked.same_as(before):
        return "skip", []
    if not walked.exact or not walked.plain or not before.exact or not before.plain:
        return "full", []  # a rule the walk cannot follow: --files-from could send an ignored file
    if {k: v[1] for k, v in walked.ignores.items()} != {k: v[1] for k, v in before.ignores.items()}:
        return "full", []  # a rule changed
    changed = _changed(walked.content, before.content)
    if not changed or sum(len(rel.encode("utf-8", "surrogateescape")) + 8 for rel in changed) \
            > MAX_PATHS_BYTES:
        return "full", []
    return "paths", changed


def _changed(content: Content, before: Content) -> list[str]:
    """The new or rewritten regular files when nothing else changed (no directory added, removed
    or changed, nothing deleted, no .gitignore, at most ``MAX_PATHS``); else []. Only directories
    whose content differs are looked into."""
    if content.keys() != before.keys():
        return []
    changed: list[str] = []
    for rel, now in content.items():
        old = before[rel]
        if old == now:
            continue
        if old[0] != now[0]:
            return []  # the directory's own mode or owner
        names, old_names = now[1], old[1]
        if any(name not in names for name in old_names):
            return []  # something was deleted here
        for name, entry in names.items():
            was = old_names.get(name, _NEW)
            if was == entry:
                continue
            if entry is None or entry[0] != "f" or name == GITIGNORE \
                    or (was is not _NEW and (was is None or was[0] != "f")):
                return []
            changed.append(rel + name)
        if len(changed) > MAX_PATHS:
            return []
    return changed


def save(path: str, key: str, token: str, walked: Walk) -> None:
    """The record after a successful sync (the walk taken before it, so a change made here during
    the sync shows as a change next time)."""
    write_private(path, dumps({"key": key, "token": token}, walked))


def forget(path: str) -> None:
    """No record (before a sync starts: one that fails leaves none)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
