"""``hostrun top`` without a terminal: the frame built from hand-made readings (a machine, a Slurm
cluster from recorded outputs, an unreadable peer), laid out at 80 and 200 columns and at 80x24
(no line wider than the terminal, no more lines than its height), sorted and filtered, and the keys
as ``KeyState`` reads them. The live view in a real terminal: tests/system/test_top_screen.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dispatch.cli.topkeys import KeyState
from dispatch.cli.toplayout import cells, cut, layout, plain
from dispatch.config.model import validate_file
from dispatch.core.units import GiB, MiB
from dispatch.hosts.kinds import host_for
from dispatch.hosts.slurm.commands import Done
from dispatch.local.store.ledgerdb import RunRecord
from dispatch.placement.reports import HostReading
from dispatch.placement.topframe import SORTS, build, meaning

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "slurm"


def machine_report(name: str, running: list[dict[str, Any]], queue: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "host": name, "hostname": f"{name}-box", "version": "0.1.0", "time": time.time(),
        "backend": "cgroup1", "slice_path": "/x", "memory": {"total": 32 * GiB, "available": 20 * GiB,
                                                             "available_for_jobs": 18 * GiB},
        "slice": {"limit": 8 * GiB, "used": 3 * GiB, "usage_with_cache": 4 * GiB, "reclaimable": GiB,
                  "booked": 5 * GiB, "booked_not_at_peak": 2 * GiB, "queued": GiB, "free": 3 * GiB},
        "load": [1.5, 1.0, 0.5], "cores": 8, "heavy_threads": 8, "threads_free": 6,
        "gpus": [{"index": 0, "uuid": "u", "name": "NVIDIA H200", "total": 140 * GiB, "used": 40 * GiB,
                  "free": 100 * GiB}], "gpu_error": None,
        "running": running, "queue": queue, "queue_length": len(queue), "label_peak": None,
        "settings": {"slice_bytes": None, "reserve_bytes": None, "default_cap": None,
                     "gamble_size": GiB, "peer_memory_cap": None, "state_dir": "/x"},
    }


def job(label: str, session: str | None, booked: int, in_use: int, cap: int | None,
        age: float) -> dict[str, Any]:
    return {"id": 1, "label": label, "pid": 10, "kind": "cap", "booked": booked, "cap": cap, "in_use": in_use,
            "age_s": age, "session": session, "command": label}


class Recorded:
    """A Slurm cluster's client commands, answering with what the private cluster printed
    (tests/recorded/slurm: one node with two GPUs, two jobs running, one pending)."""

    def run(self, argv: list[str], timeout: float) -> Done:
        name = {"scontrol -d show": "node_gres.txt", "squeue --noheader --format": "squeue_named.txt",
                "scontrol show config": "config.txt"}[" ".join(argv[:3])]
        return Done(0, (RECORDED / name).read_text(encoding="utf-8"), "")


@pytest.fixture
def readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[HostReading]:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\nenable_across_machines = true\n[hosts.local]\n"
                   "[hosts.c]\nkind = 'slurm'\n[hosts.peer1]\nssh = 'peer1.example'\n")
    settings = validate_file(str(cfg))
    farm = host_for(settings, "c")
    monkeypatch.setattr(farm, "commands", Recorded)
    local = host_for(settings, "local")
    peer = host_for(settings, "peer1")
    long_label = "a-very-long-label-" + "x" * 150
    report = machine_report("local", [
        job("build", "alice", GiB, 900 * MiB, GiB, 65.0),
        job(long_label, "bob", 2 * GiB, 100 * MiB, 4 * GiB, 5.0),
        job("tests", "carol", 512 * MiB, 300 * MiB, None, 300.0)],
        [{"id": 4, "label": "waiter", "pid": 11, "need": 3 * GiB, "waited_s": 12.0, "session": "dave",
          "reason": "memory: need 3.0 GiB, free 1.0 GiB; held by build (pid 10, 1.0 GiB)"}])
    return [HostReading("local", report, None, 0.01, local),  # type: ignore[arg-type]
            HostReading("c", farm.report(), None, 0.2, farm),
            HostReading("peer1", None, "ssh: connect to host peer1.example port 22: Connection refused",
                        3.0, peer)]


def runs() -> list[RunRecord]:
    now = time.time()
    return [RunRecord(now - 30, now - 20, 10.0, 0.0, "local", "hog", "alice", "python3 hog.py", 100 * MiB,
                      "cap", 100 * MiB, 100 * MiB, 250, "own-cap", True),
            RunRecord(now - 10, now - 5, 5.0, 0.0, "local", "fine", "bob", "true", None, "gamble", GiB,
                      MiB, 0, "exit", False),
            RunRecord(now - 9, now - 4, 5.0, 0.0, "local", "killed", "bob", "sleep 9", None, "gamble",
                      GiB, MiB, 137, "signal", False)]


def frame(readings: list[HostReading], sort: str = SORTS[0], text: str = "") -> Any:
    alerts = [{"kind": "own-cap", "time": time.time(), "host": "local", "label": "hog", "session": "alice",
               "message": "job hog on local was killed at its own cap 100 MiB " + "y" * 200}]
    return build(readings, {"local": time.time(), "c": time.time(), "peer1": time.time() - 75}, runs(),
                 alerts, "recent alerts", time.time(), sort, text)


@pytest.mark.parametrize("width", [80, 200])
def test_no_line_is_wider_than_the_terminal(readings: list[HostReading], width: int) -> None:
    lines = plain(layout(frame(readings), width)).splitlines()
    assert all(cells(line) <= width for line in lines), [line for line in lines if cells(line) > width]
    text = "\n".join(lines)
    assert "local (local-box), hostrun 0.1.0" in text
    assert "NVIDIA H200" in text and "for jobs 18.0 GiB" in text
    assert "Slurm cluster hr17555" in text and "915 MiB free to allocate" in text  # what its kind says
    assert "peer1: could not read (last read" in text and "ago" in text  # unread, and when it last was
    assert "waits" in text  # the cluster's pending job, by the keys every report has
    assert "own-cap" in text and "killed by SIGKILL" in text
    assert any(line.endswith("…") for line in lines)  # the long label and the alert are cut
    if width == 80:
        assert "connect to host" in text
    else:
        assert "the job was OOM-killed at its own cap" in text and "held by build" in text
        assert "Resources; held by wide, hold-gpu" in text  # the cluster's pending job: its holders


def test_80x24_drops_rows_and_sections_never_wraps(readings: list[HostReading]) -> None:
    lines = layout(frame(readings), 80, 24)
    assert len(lines) <= 24
    text = plain(lines).splitlines()
    assert all(cells(line) <= 80 for line in text)
    assert "taller terminal" in plain(lines)
    assert len(layout(frame(readings), 40, 10)) <= 10
    assert all(cells(line) <= 40 for line in plain(layout(frame(readings), 40, 10)).splitlines())
    assert len(layout(frame(readings), 80, 24, help_shown=True)) <= 24


def test_sort_and_filter(readings: list[HostReading]) -> None:
    def local(sort: str) -> list[Any]:
        return [j for j in frame(readings, sort).jobs if j.host == "local"]

    assert [j.label for j in local("elapsed")][:2] == ["tests", "build"]
    assert local("near cap")[0].label == "build"
    assert [j.session for j in frame(readings, "session").jobs][:3] == ["", "", "alice"]  # Slurm's: none
    only = frame(readings, text="ALI")
    assert [j.label for j in only.jobs] == ["build"]
    assert [o.label for o in only.outcomes] == ["hog"] and only.queue == ()
    assert [q.label for q in frame(readings, text="wait").queue] == ["waiter", "waits"]


def test_exit_codes_are_explained() -> None:
    assert meaning(0, "exit") == "ok"
    assert meaning(250, "own-cap") == "the job was OOM-killed at its own cap"
    assert meaning(143, "signal") == "killed by SIGTERM"
    assert meaning(3, "exit") == "the job's own exit status"


def test_cut_counts_cells() -> None:
    assert cut("abcdef", 4) == "abc…" and cut("abc", 4) == "abc"
    assert cells(cut("日本語のラベル", 5)) <= 5


def test_keys() -> None:
    keys = KeyState()
    keys.feed(b"s")
    assert keys.sort == SORTS[1]
    keys.feed(b"/ali\x7fi")
    assert keys.typing == "ali" and keys.filter == ""
    keys.feed(b"\r")
    assert (keys.typing, keys.filter) == (None, "ali")
    keys.feed(b"\x1b[A")  # an arrow key is not Esc
    assert keys.filter == "ali"
    keys.feed(b"\x1b")
    assert keys.filter == ""
    keys.feed(b"h")
    assert keys.help
    keys.feed(b"q")
    assert keys.quit


def test_a_kind_without_gauges_shows_its_summary(tmp_path: Path) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\n")
    host = host_for(validate_file(str(cfg)), "local")
    from dispatch.hosts.base import Host

    report = machine_report("local", [], [])
    [gauge] = Host.gauges(host, report)  # type: ignore[arg-type]  # the base class's answer
    assert gauge.text == host.summary(report)  # type: ignore[arg-type]


def test_a_new_kind_is_shown_by_what_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The toy kind (tests/support/toykind.py) has no gauges of its own: its summary stands."""
    from dispatch.cli.main import main
    from dispatch.hosts.kinds import KINDS
    from tests.support.toykind import ToyHost

    monkeypatch.setitem(KINDS, "toy", ToyHost)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HOSTRUN_SESSION", raising=False)
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\nslice = '1G'\n"
                   "[hosts.farm]\nkind = 'toy'\nqueue = 'q1'\nlimit = '2G'\n")
    assert main(["--config", str(cfg), "top", "--once", "--host", "farm"]) == 0
    out = capsys.readouterr().out
    assert "farm, hostrun toy\n  toy queue q1, 2.0 GiB free of 2.0 GiB, 0 running\n" in out, out
    assert "running: none" in out and "last outcomes here: none" in out


def test_a_slow_host_never_holds_the_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host is read in a thread of its own: one that does not answer is said to be so past the
    deadline, while the view goes on drawing; once it answers, its reading is shown again."""
    import threading

    from dispatch.hosts.kinds import KINDS
    from dispatch.placement.hostwatch import NOT_READ, HostWatch
    from tests.conftest import wait_for
    from tests.support.toykind import ToyHost

    gate = threading.Event()

    class SlowToy(ToyHost):
        def report(self, label: str | None = None, peaks: bool = False) -> Any:
            gate.wait(30)
            return super().report(label, peaks)

    monkeypatch.setitem(KINDS, "toy", SlowToy)
    monkeypatch.delenv("HOSTRUN_SESSION", raising=False)
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\nreport_deadline = '1s'\n[hosts.local]\n"
                   "[hosts.farm]\nkind = 'toy'\nqueue = 'q1'\nlimit = '2G'\n")
    watch = HostWatch(validate_file(str(cfg)), 0.2, ["farm"])
    watch.start()
    try:
        assert watch.readings()[0][0].error == NOT_READ  # at once, not after the read
        wait_for(lambda: "no answer for" in (watch.readings()[0][0].error or ""), timeout=10)
        assert not watch.answered()
        gate.set()
        wait_for(lambda: watch.readings()[0][0].ok, timeout=10)
        assert "farm" in watch.readings()[1] and watch.answered()
    finally:
        gate.set()
        watch.stop()


def test_alerts_are_the_sessions_unread_ones_left_unread(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.placement import alerts
    from dispatch.placement.hostwatch import HostWatch

    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\n")
    settings = validate_file(str(cfg))
    for session in ("s1", "s2"):
        alerts.append(settings.alerts_path, alerts.record(
            alerts.OWN_CAP, host="local", label=f"job-of-{session}", session=session, command="x",
            action="hostrun -m 1G -- x", message=f"job job-of-{session} was killed at its own cap"))
    monkeypatch.setenv("HOSTRUN_SESSION", "s1")
    watch = HostWatch(settings, 1.0, ["local"])
    runs, found, notes = watch.history_and_alerts()
    assert (runs, notes) == ([], [])
    assert [a["label"] for a in found] == ["job-of-s1"]
    assert watch.alerts_title() == "unread alerts for session s1"
    assert [a["label"] for a in alerts.unread(settings, "s1")] == ["job-of-s1"]  # still unread
    monkeypatch.delenv("HOSTRUN_SESSION")
    watch = HostWatch(settings, 1.0, ["local"])
    assert [a["label"] for a in watch.history_and_alerts()[1]] == ["job-of-s1", "job-of-s2"]
    assert watch.alerts_title() == "recent alerts"


def test_agent_sessions_are_shown_apart_with_their_jobs(tmp_path: Path) -> None:
    """Sessions (``role: session``) get a section of their own with their use, cap and how many
    running jobs each started; each job started in one names it (two sessions of one label by their
    ids); the filter on a session's name keeps it and its jobs; the panel has a sessions gauge."""
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\n")
    local = host_for(validate_file(str(cfg)), "local")

    def run(id_: int, label: str, role: str, inside: int | None, booked: int, in_use: int,
            cap: int) -> dict[str, Any]:
        return {**job(label, None, booked, in_use, cap, 30.0), "id": id_, "role": role,
                "in_session": inside}

    report = machine_report("local", [
        run(5, "session:claude", "session", None, 2 * GiB, 1536 * MiB, 4 * GiB),
        run(6, "session:claude", "session", None, 2 * GiB, 512 * MiB, 4 * GiB),
        run(7, "cargo-build", "job", 5, GiB, 800 * MiB, GiB),
        run(8, "pytest", "job", 5, 512 * MiB, 100 * MiB, GiB),
        run(9, "lint", "job", 6, 256 * MiB, 10 * MiB, GiB),
        run(10, "alone", "job", None, 256 * MiB, 10 * MiB, GiB)], [])
    report["sessions"] = {"count": 2, "booked": 4 * GiB, "in_use": 2 * GiB, "jobs": 3, "limit": 8 * GiB}
    readings = [HostReading("local", report, None, 0.01, local)]  # type: ignore[arg-type]
    shown = build(readings, {"local": time.time()}, [], [], "recent alerts", time.time())
    assert [(s.label, s.jobs, s.cap, s.in_use) for s in shown.sessions] == [
        ("session:claude #5", 2, 4 * GiB, 1536 * MiB), ("session:claude #6", 1, 4 * GiB, 512 * MiB)]
    assert {j.label: j.in_session for j in shown.jobs} == {
        "cargo-build": "claude #5", "pytest": "claude #5", "lint": "claude #6", "alone": ""}
    for width in (80, 160):
        text = plain(layout(shown, width, 40)).splitlines()
        assert all(cells(line) <= width for line in text), text
        titles = [n for n, line in enumerate(text) if line.startswith(("agent sessions (2)", "running (4)"))]
        assert len(titles) == 2, text
        gauge = "2 running (3 jobs), used 2.0 GiB, booked 4.0 GiB" + (" of 8.0 GiB" if width > 80 else "")
        assert any(line.startswith(" sessions [") and gauge in line for line in text), text
        words = [(line.split(), line) for line in text if line.startswith("local ")]
        rows = {" ".join(w[1:3]) if w[1].startswith("session:") else w[1]: line for w, line in words}
        assert rows["session:claude #5"].split()[3] == "2" and "38%" in rows["session:claude #5"]
        assert rows["cargo-build"].endswith(" claude #5") and rows["alone"].endswith("-")
        assert "78%" in rows["cargo-build"] and "%" in rows["lint"]  # near cap kept at 80 columns
    only = build(readings, {"local": time.time()}, [], [], "recent alerts", time.time(), filter_text="#6")
    assert [s.label for s in only.sessions] == ["session:claude #6"]
    assert [j.label for j in only.jobs] == ["lint"]


def test_a_report_without_sessions_shows_no_session_parts(readings: list[HostReading]) -> None:
    """An older peer's agent, a cluster: no ``role``, no ``in_session``, no ``sessions``: no
    sessions section, gauge or column, as before."""
    shown = frame(readings)
    assert shown.sessions == () and all(j.in_session == "" for j in shown.jobs)
    text = plain(layout(shown, 200))
    assert "agent session" not in text and " sessions " not in text


def test_odd_session_keys_from_a_peer_break_nothing(tmp_path: Path) -> None:
    """A peer's report with odd ``role``/``in_session``/``id`` values: the view and ``hostrun
    report``'s table still show every run, no exception; a job naming no running session shows its
    id."""
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\n")
    local = host_for(validate_file(str(cfg)), "local")
    running = [{**job("s", None, MiB, MiB, 2 * MiB, 1.0), "id": [1], "role": "session", "in_session": None},
               {**job("a", None, MiB, MiB, 2 * MiB, 1.0), "id": 2, "role": 7, "in_session": {"x": 1}},
               {**job("b", None, MiB, MiB, 2 * MiB, 1.0), "id": 3, "role": "job", "in_session": 99}]
    report = machine_report("local", running, [])
    shown = build([HostReading("local", report, None, 0.01, local)],  # type: ignore[arg-type]
                  {"local": time.time()}, [], [], "recent alerts", time.time())
    assert [(s.label, s.jobs) for s in shown.sessions] == [("s", 0)]
    assert [(j.label, j.in_session) for j in shown.jobs] == [("a", ""), ("b", "#99")]
    assert "s " in plain(layout(shown, 80))
    [_, grid] = local.describe(report)  # type: ignore[arg-type]
    assert [row[-1].text for row in grid.rows] == ["session, 0 jobs", "-", "#99"]  # type: ignore[union-attr]


def test_a_failing_history_read_is_said_and_stop_waits_for_the_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any error while reading this machine's history (not only hostrun's and the OS's) becomes a
    note on the screen and the reader goes on; ``stop`` waits for the reader, so that the interpreter's
    shutdown never cuts it halfway (a thread's traceback on the user's terminal after ``q``: seen once
    on CI)."""
    import threading

    from dispatch.placement.hostwatch import HostWatch
    from tests.conftest import wait_for

    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\n")
    watch = HostWatch(validate_file(str(cfg)), 0.05, ["local"])
    calls: list[int] = []
    reading = threading.Event()
    release = threading.Event()

    def failing() -> Any:
        calls.append(1)
        if len(calls) >= 3:
            reading.set()
            release.wait(5)
        raise ValueError("a row the reader did not expect")

    monkeypatch.setattr(watch, "history_and_alerts", failing)
    monkeypatch.setattr(watch, "hosts", [])
    watch.start()
    try:
        wait_for(lambda: reading.is_set(), timeout=10)
        assert watch.here()[2] == ["history: ValueError: a row the reader did not expect"]
    finally:
        threading.Timer(0.3, release.set).start()
        watch.stop()
    assert watch._here_thread is not None and not watch._here_thread.is_alive()
