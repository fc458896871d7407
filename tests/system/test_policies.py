"""Queue policies: per-group caps (--group), idle-only jobs (--when-idle) and the SKIP log, with real
cgroup v1 slices, a real ledger and real concurrent hostrun processes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Hostrun, wait_for

GROUPS = "[groups.build]\nmax_running = 1\n[groups.test]\nmax_running = 1\n[groups.lint]\nmax_running = 2\n"


def spans(marks: Path) -> dict[str, tuple[float, float]]:
    result = {}
    for f in marks.iterdir():
        start, end = (float(x) for x in f.read_text().split())
        result[f.name] = (start, end)
    return result


def job(hostrun: Hostrun, marks: Path, name: str, group: str, seconds: float = 1.0) -> object:
    return hostrun.popen("-m", "40M", "--group", group, "--label", name, "--", "sh", "-c",
                         f"date +%s.%N > {marks}/{name}; sleep {seconds}; date +%s.%N >> {marks}/{name}")


def test_group_caps_with_three_groups_do_not_starve_the_others(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.state_dir.mkdir(exist_ok=True)
    (tmp_path / "top").write_text("")
    hostrun.configure(slice="300M", peers=GROUPS)
    marks = tmp_path / "marks"
    marks.mkdir()
    order = [("build1", "build"), ("build2", "build"), ("test1", "test"), ("build3", "build"),
             ("lint1", "lint"), ("test2", "test"), ("lint2", "lint"), ("lint3", "lint")]
    procs = []
    for name, group in order:  # build1 long enough for the others to arrive on a loaded machine
        procs.append(job(hostrun, marks, name, group, seconds=4.0 if name == "build1" else 1.0))
        wait_for(lambda n=name: any(b[1] == n for b in hostrun.bookings()) or (marks / n).exists())
    for p in procs:
        p.wait(timeout=60)  # type: ignore[attr-defined]
        assert p.returncode == 0  # type: ignore[attr-defined]
    s = spans(marks)

    def most_at_once(names: list[str]) -> int:
        points = sorted([(s[n][0], 1) for n in names] + [(s[n][1], -1) for n in names])
        running = peak = 0
        for _, delta in points:
            running += delta
            peak = max(peak, running)
        return peak

    assert most_at_once(["build1", "build2", "build3"]) == 1
    assert most_at_once(["test1", "test2"]) == 1
    assert most_at_once(["lint1", "lint2", "lint3"]) == 2
    # No starvation: test1 and lint1 arrived behind build2 (held by the build cap) and still started
    # while build1 was running.
    assert s["test1"][0] < s["build1"][1] and s["lint1"][0] < s["build1"][1]
    log = (hostrun.state_dir / "queue.log").read_text()
    assert "SKIP group-cap build 1/1" in log


def test_waiting_reason_shows_the_group_cap(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(slice="300M", peers=GROUPS)
    marks = tmp_path / "marks"
    marks.mkdir()
    first = job(hostrun, marks, "b1", "build", seconds=2)
    wait_for(lambda: (marks / "b1").exists())
    second = hostrun.popen("-m", "40M", "--group", "build", "--label", "b2", "--", "true")
    wait_for(lambda: any(b[1] == "b2" for b in hostrun.bookings()))
    reason = wait_for(lambda: next((q["reason"] for q in json.loads(hostrun.run("ledger", "--json").stdout)
                                    ["queue"] if q["label"] == "b2" and q["reason"]), None), timeout=10)
    assert reason == "group-cap build 1/1"
    first.wait(timeout=30)  # type: ignore[attr-defined]
    second.wait(timeout=30)
    assert second.returncode == 0
    assert "waiting: group-cap build 1/1; held by b1" in second.stderr.read()  # type: ignore[union-attr]


def test_when_idle_waits_for_an_idle_host_without_blocking_others(hostrun: Hostrun, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    holder = hostrun.popen("-m", "40M", "--label", "holder", "--", "sh", "-c",
                           f"date +%s.%N > {marks}/holder; sleep 2; date +%s.%N >> {marks}/holder")
    wait_for(lambda: (marks / "holder").exists())
    idle = hostrun.popen("-m", "40M", "--when-idle", "--label", "idle", "--", "sh", "-c",
                         f"date +%s.%N > {marks}/idle; date +%s.%N >> {marks}/idle")
    wait_for(lambda: any(b[1] == "idle" and b[2] == "waiting" for b in hostrun.bookings()))
    normal = hostrun.run("-m", "40M", "--label", "normal", "--", "sh", "-c",
                         f"date +%s.%N > {marks}/normal; date +%s.%N >> {marks}/normal")
    assert normal.returncode == 0
    holder.wait(timeout=30)
    idle.wait(timeout=30)
    assert idle.returncode == 0
    s = spans(marks)
    assert s["normal"][0] < s["holder"][1]  # the idle-only job ahead of it did not hold it back
    assert s["idle"][0] >= s["holder"][1]  # ... and it started only once the host was idle
    assert "waiting: when-idle idle — " in idle.stderr.read()  # type: ignore[union-attr]
    assert "SKIP when-idle idle — " in (hostrun.state_dir / "queue.log").read_text()


def test_unknown_group_key_is_a_config_error(hostrun: Hostrun) -> None:
    hostrun.configure(slice="300M", peers="[groups.build]\nmax_runing = 2\n")
    proc = hostrun.run("--", "true")
    assert proc.returncode == 2 and "groups.build.max_runing: unknown key" in proc.stderr
