"""The peer side's set-up, shared by the agent's commands (``dispatch.agent.main``) and its framed run
(``dispatch.agent.run``): the peer's settings, and the probe step that readies the job's work
directory. Standard library only; it sits below both so that neither imports the other.
"""

from __future__ import annotations

import os
import sys

from dispatch import __version__

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.agent.prepareshape import PrepareReply, PrepareSpec
    from dispatch.core.reportshape import MachineReport, PeerNotes
    from dispatch.core.settings import Settings


def _load_toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - old peers
        try:
            import tomli as tomllib
        except ImportError:
            raise RuntimeError(f"{path}: Python {sys.version.split()[0]} cannot read TOML "
                               "(needs 3.11+, or tomli)") from None
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def agent_report(fallback: dict[str, Any], label: str | None, peaks: bool) -> MachineReport:
    """This peer's report as the controller reads it: the machine's, with the agent's version, its
    python and its notes on its own configuration (``agent report``, and the report daemon)."""
    from dispatch.local.report import local_report

    settings, notes = peer_settings(fallback)
    data = local_report(settings, label=label, peaks=peaks)
    data["config"], data["config_error"] = notes["config"], notes["config_error"]
    data["disagreements"] = notes["disagreements"]
    data["agent_version"] = __version__
    data["python"] = sys.version.split()[0]
    return data


def peer_settings(fallback: dict[str, Any]) -> tuple[Settings, PeerNotes]:
    """The peer's settings, and notes for the controller (config source, disagreements)."""
    from dispatch.core.configfile import settings_from_dict
    from dispatch.core.configpath import find_config
    from dispatch.core.hostkeys import FALLBACK_FIELDS, LOCAL
    from dispatch.core.settings import Settings

    notes: PeerNotes = {"config": None, "config_error": None, "disagreements": []}
    settings = Settings.default()
    try:
        path = find_config(None, os.environ)
        if path is not None:
            from dispatch.guards.trust import check_file

            check_file(path, "config file", os.environ)  # as on the controller (docs/trust.md)
            settings = settings_from_dict(_load_toml(path), path)
            notes["config"] = os.path.abspath(path)
    except Exception as exc:
        notes["config_error"] = str(exc)
    settings = settings.with_env_overrides(os.environ)
    own = settings.local
    merged = {}
    for key in FALLBACK_FIELDS:  # the controller's values: where the peer has its own, it wins
        mine, theirs = getattr(own, key), fallback.get(key)
        if mine is None and theirs is not None:
            merged[key] = theirs
        elif mine is not None and theirs is not None and mine != theirs:
            notes["disagreements"].append({"key": key, "peer": mine, "controller": theirs})
    if merged:
        settings = settings._replace(hosts={**settings.hosts, LOCAL: own._replace(**merged)})
    return settings, notes


def probe(spec: PrepareSpec) -> PrepareReply:
    """The job's work directory made ready (and claimed), then the toolchain probe outputs, taken in
    the job's directory there with the tree's toolchain files seeded first (the sync comes later)."""
    from dispatch.core.configpath import cache_dir
    from dispatch.guards.toolchain import probe_here, seed

    workdir = spec.get("workdir")
    data: PrepareReply = {"agent_version": __version__}
    where = None
    if workdir:
        path = os.path.abspath(os.path.expanduser(workdir))
        try:
            os.makedirs(path, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "not writable")
            data["workdir"] = path
        except OSError as exc:
            data["workdir_error"] = f"{path}: {exc.strerror}"
        owner = spec.get("owner")
        if owner and "workdir" in data:  # claim the sync target for the controller's session
            from dispatch.guards.workdirs import claim_if_unclaimed

            data["workdir_owner"] = claim_if_unclaimed(path, str(owner.get("purpose") or ""),
                                                       str(owner.get("session") or ""))
        if "workdir" in data:
            seed(path, spec.get("toolchain_files") or {})
            where = _job_dir(path, str(spec.get("job_dir") or ""))
    data["probes"] = probe_here(spec.get("probes", []), cache_dir(os.environ), where)
    return data


def _job_dir(workdir: str, rel: str) -> str:
    """The job's directory in the peer's copy, created if the tree has not been synced there yet (but
    never through a symbolic link in the copy); the work directory itself when it cannot be had."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or ".." in parts:
        return workdir
    path = workdir
    for part in parts:
        path = os.path.join(path, part)
        if os.path.islink(path):
            break
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError:
            return workdir
    path = os.path.join(workdir, *parts)
    return path if os.path.isdir(path) else workdir

