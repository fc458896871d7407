"""The declared report shapes (``dispatch.core.reportshape``, ``dispatch.hosts.slurm.shape``) are what
the code really builds: a real report of this machine, a peer agent's report (the same code the agent
runs there), and a cluster's report from recorded Slurm outputs are each checked key by key and type
by type against their ``TypedDict`` (no key missing, none undeclared); and the records a report
carries as dicts have the fields of the NamedTuples they come from."""

from __future__ import annotations

import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NotRequired, Union, get_args, get_origin

import pytest
import typing_extensions
from typing_extensions import ReadOnly

from dispatch.config.model import validate_file
from dispatch.core import reportshape
from dispatch.hosts.slurm import shape as slurmshape
from dispatch.local.admission.ledger import Ledger
from dispatch.local.gpus.gpu import Gpu
from dispatch.local.store.ledgerdb import PeakRecord
from tests.conftest import Hostrun

MiB = 1 << 20


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """The type inside ``ReadOnly``/``NotRequired``, and whether the key may be absent."""
    optional = False
    while get_origin(tp) in (ReadOnly, NotRequired, typing_extensions.NotRequired):
        optional = optional or get_origin(tp) in (NotRequired, typing_extensions.NotRequired)
        tp = get_args(tp)[0]
    return tp, optional


def conforms(value: Any, tp: Any, path: str = "report") -> None:
    """Raise AssertionError naming the first place where ``value`` is not of ``tp``."""
    origin, args = get_origin(tp), get_args(tp)
    if typing_extensions.is_typeddict(tp):
        assert isinstance(value, dict), f"{path}: not a dict"
        hints = typing_extensions.get_type_hints(tp, include_extras=True)
        fields = {key: _unwrap(hint) for key, hint in hints.items()}
        missing = {k for k, (_, optional) in fields.items() if not optional} - value.keys()
        extra = value.keys() - fields.keys()
        assert not missing and not extra, f"{path}: missing {sorted(missing)}, undeclared {sorted(extra)}"
        for key, item in value.items():
            conforms(item, fields[key][0], f"{path}.{key}")
    elif origin in (Union, types.UnionType):
        problems = []
        for choice in args:
            try:
                conforms(value, choice, path)
                return
            except AssertionError as exc:
                problems.append(str(exc))
        raise AssertionError(f"{path}: {value!r} is none of {args}: {problems}")
    elif origin in (list, Sequence):
        assert isinstance(value, list), f"{path}: not a list"
        for i, item in enumerate(value):
            conforms(item, args[0], f"{path}[{i}]")
    elif origin is dict:
        assert isinstance(value, dict), f"{path}: not a dict"
    elif origin is Literal:
        assert value in args, f"{path}: {value!r} not in {args}"
    elif tp is type(None) or tp is None:
        assert value is None, f"{path}: {value!r} is not None"
    elif tp is float:
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{path}: {value!r}"
    elif tp in (int, str, bool):
        assert isinstance(value, tp) and (tp is bool or not isinstance(value, bool)), f"{path}: {value!r}"
    elif tp is not object:
        raise AssertionError(f"{path}: the checker does not know {tp!r}")


def test_the_checker_fails_on_a_missing_an_undeclared_and_a_mistyped_key() -> None:
    room = {"limit": 1, "free": 2}
    conforms(room, reportshape.Room)
    for bad in ({"limit": 1}, {**room, "more": 3}, {"limit": "1", "free": 2}, {"limit": True, "free": 2}):
        with pytest.raises(AssertionError):
            conforms(bad, reportshape.Room)


def test_this_machines_report_is_a_machine_report(hostrun: Hostrun) -> None:
    from dispatch.config import load_settings
    from dispatch.local.report import local_report

    assert hostrun.run("-l", "shape", "-m", "64M", "--", "true").returncode == 0
    settings = load_settings(str(hostrun.config_path))
    report = local_report(settings, label="shape", peaks=True)
    assert report["label_peak"] is not None and report["peak_table"]
    conforms(report, reportshape.MachineReport)
    from dispatch.local.report import admission_engine

    report["admission_engine"] = admission_engine(settings)  # what `hostrun report` adds here
    conforms(report, reportshape.MachineReport)


def test_a_peer_agents_report_is_a_machine_report(hostrun: Hostrun, monkeypatch: pytest.MonkeyPatch) -> None:
    """``agent_report`` is what a peer's agent sends (the bundle runs this code there)."""
    from dispatch.agent.prepare import agent_report

    monkeypatch.setenv("HOSTRUN_CONFIG", str(hostrun.config_path))
    report = agent_report({"default_cap": 64 * MiB}, None, False)
    assert {"agent_version", "python", "config", "disagreements"} <= report.keys()
    conforms(report, reportshape.MachineReport)


def test_a_clusters_report_is_a_cluster_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.hosts.kinds import host_for
    from dispatch.hosts.slurm.commands import Done
    from dispatch.hosts.slurm.report import cluster_report

    recorded = Path(__file__).resolve().parents[1] / "recorded" / "slurm"
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\n[hosts.c]\nkind = 'slurm'\n")
    host = host_for(validate_file(str(cfg)), "c")
    outputs = {"scontrol -d show": (recorded / "node_gres.txt").read_text(),
               "squeue --noheader --format": (recorded / "squeue_named.txt").read_text(),
               "scontrol show config": (recorded / "config.txt").read_text()}

    class Commands:
        def run(self, argv: list[str], timeout: float) -> Done:
            return Done(0, outputs[" ".join(argv[:3])], "")

    monkeypatch.setattr(host, "commands", lambda: Commands())
    ledger = Ledger(str(tmp_path / "state"))
    ledger.record_peak("build", "c", 64 * MiB, False, 1.0, cap=None)
    ledger.close()
    report = cluster_report(host, "build", peaks=True)  # type: ignore[arg-type]
    assert report["running"] and report["queue"] and report["label_peak"] is not None
    conforms(report, slurmshape.ClusterReport)


def test_the_records_a_report_carries_keep_their_fields() -> None:
    from dispatch.local.report import REPORT_LEFT_OUT

    peak = typing_extensions.get_type_hints(reportshape.PeakRecordData)
    assert list(peak) == [f for f in PeakRecord._fields if f not in REPORT_LEFT_OUT]
    assert list(typing_extensions.get_type_hints(reportshape.Gpu)) == list(Gpu._fields)
