"""The declared shape of a peer run's prepare step: what the controller asks of the agent first
(``PrepareSpec``, in the run spec's ``prepare``), the agent's answer (``PrepareReply``, the ``P``
frame, checked where the controller reads it: ``peerrun.checked_prepared``), the go token (``G``)
and the copy's manifest header. The steps: docs/peers.md.

Type-checking only: runtime modules import it under ``if MYPY:`` (the agent runs on a bare peer,
Python 3.9 or later, standard library only).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict


class WorkClaim(TypedDict):
    """The owner claim on the peer's copy (``remotetree.work_claim``)."""

    session: str
    purpose: str


class CopyWanted(TypedDict):
    excludes: List[str]  # the sync's excludes: the walk of the copy leaves them out


class PrepareSpec(TypedDict, total=False):
    probes: List[str]  # toolchain probes to take in the job's directory
    workdir: str  # the copy's directory (``~`` expanded there)
    owner: WorkClaim
    job_dir: str  # the job's directory, relative to the copy
    toolchain_files: Dict[str, str]  # the tree's toolchain selector files, seeded before the probes
    copy: CopyWanted  # check the copy against the last sync's manifest
    sync_mark: str  # the controller's sync's mark (its rsync stopped by it when the run ends)


class CopyState(TypedDict):
    """Whether the copy is as the last sync left it (``treestate.check_copy``)."""

    token: Optional[str]  # the last sync's token (None: no usable manifest)
    clean: bool


class PrepareReply(TypedDict, total=False):
    agent_version: str
    workdir: str  # the copy's directory, made and writable (else ``workdir_error``)
    workdir_error: str
    workdir_owner: Dict[str, Any]  # guards.workdirowner.claim_if_unclaimed's answer
    probes: Dict[str, Dict[str, Any]]  # guards.toolchain.probe_here's outputs
    copy: CopyState


class GoToken(TypedDict, total=False):
    """The ``G`` frame's payload: the new sync's token, and the paths it synced (None: in full)."""

    token: str
    paths: Optional[List[str]]


class ManifestHeader(TypedDict, total=False):
    key: str  # the controller's record: the peer and copy it describes
    token: str  # the sync whose copy the manifest describes
