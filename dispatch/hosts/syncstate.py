"""Whether ``hostrun --peer`` must rsync: the controller's record of its tree at the last sync to a
peer, and the choice between no sync, a sync of known paths (``--files-from``) and the full rsync
(docs/peers.md, "The peer's copy of your tree").

A job may edit files in the peer's copy, so "nothing changed here" is not "the copy is current":
rsync is skipped only when this tree's walk equals the one recorded at the last successful sync AND
the agent says its copy still matches the manifest it saved then (same token: the same sync). When
only changed or new files here and the copy is clean, only they are sent. Anything else, or any
doubt (no record, a damaged or foreign one, other sync options), is the full rsync.

The record: ``<state_dir>/peer-sync/<host>-<tree id>`` (0600 in a 0700 directory, both checked),
a JSON header line (version, key, token, digest) and a JSON line of the walk's entries, which is read
only when the digests differ.
"""

from __future__ import annotations

import json
import os
import stat

from dispatch.agent.treestate import GITIGNORE, VERSION, read_private, write_private

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.agent.treestate import Walked

    Loaded = tuple[dict[str, Any], "dict[str, Any] | None"]  # the header, the entries if read

MAX_PATHS = 1000  # more changed paths than this: the full rsync (its walk is then worth it)
MAX_PATHS_BYTES = 256 << 10  # the paths travel in the go frame (at most 1 MiB): well below it


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


def load(path: str, walked: Walked | None) -> Loaded | None:
    """The record's header and, when this walk differs from it, its entries (read in the walk's
    thread, off the critical path); None when there is no usable record."""
    if walked is None:
        return None
    data = read_private(path)
    if data is None:
        return None
    head, _, body = data.partition(b"\n")
    try:
        record = json.loads(head)
        if not isinstance(record, dict):
            return None
        before = None
        if record.get("digest") != walked[1] and walked[3]:
            before = json.loads(body)
    except ValueError:
        return None
    return record, before if isinstance(before, dict) else None


def plan(loaded: Loaded | None, key: str, walked: Walked | None,
         copy: dict[str, Any] | None) -> tuple[str, list[str]]:
    """``("skip", [])``, ``("paths", changed)`` or ``("full", [])``."""
    if walked is None or loaded is None or not isinstance(copy, dict) or not copy.get("clean") \
            or not copy.get("token"):
        return "full", []
    record, before = loaded
    if record.get("version") != VERSION or record.get("key") != key \
            or record.get("token") != copy["token"]:
        return "full", []
    if record.get("digest") == walked[1]:
        return "skip", []
    if not walked[3] or before is None:  # a rule the walk cannot follow: --files-from could send
        return "full", []                # an ignored file (it reads no .gitignore)
    changed = []
    entries = walked[0]
    if len(entries) < len(before):
        return "full", []  # something was deleted here
    for rel, entry in entries.items():
        old = before.get(rel)
        if old is not None and list(entry) == old:
            continue
        # Only a new or rewritten regular file, in a directory the copy has, no rule changed.
        parent = rel.rpartition("/")[0]
        if entry[0] != "f" or (old is not None and old[0] != "f") or rel.rpartition("/")[2] == GITIGNORE \
                or (parent and before.get(parent) != ["d"]):
            return "full", []
        changed.append(rel)
        if len(changed) > MAX_PATHS:
            return "full", []
    if any(rel not in entries for rel in before):
        return "full", []
    if sum(len(rel.encode("utf-8", "surrogateescape")) + 8 for rel in changed) > MAX_PATHS_BYTES:
        return "full", []
    return ("paths", changed) if changed else ("full", [])


def save(path: str, key: str, token: str, walked: Walked) -> None:
    """The record after a successful sync (the walk taken before it, so a change made here during
    the sync shows as a change next time)."""
    head = json.dumps({"version": VERSION, "key": key, "token": token, "digest": walked[1]})
    body = json.dumps(walked[0], separators=(",", ":"))
    write_private(path, f"{head}\n{body}".encode("utf-8", "surrogateescape"))


def forget(path: str) -> None:
    """No record (before a sync starts: one that fails leaves none)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
