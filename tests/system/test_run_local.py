"""`hostrun -- CMD` on this host, end to end, with real cgroup v1 memory cgroups and a real ledger.

Each test runs the real CLI (``python -m dispatch``) as a subprocess against its own slice (a child of
this process's memory cgroup) and its own state directory; the fixture's teardown fails the test if a
process, a job cgroup or a booking is left behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from dispatch.core.units import MiB
from tests.conftest import Hostrun, pid_alive, wait_for

PY = sys.executable


def result(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_exit_status_passes_through(hostrun: Hostrun) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    assert hostrun.run("-m", "64M", "--", "sh", "-c", "exit 3").returncode == 3
    assert hostrun.run("-m", "64M", "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    assert hostrun.run("-m", "64M", "--", "sh", "-c", "kill -KILL $$").returncode == 128 + 9


def test_result_file_for_plain_exit(hostrun: Hostrun, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "64M", "--label", "three", "--result-file", str(out), "--",
                       "sh", "-c", "exit 3")
    assert proc.returncode == 3
    r = result(out)
    assert r["exit_code"] == 3 and r["outcome"] == "exit"
    assert r["host"] == "local" and r["label"] == "three"
    assert r["cap_bytes"] == 64 * MiB and r["booking_kind"] == "cap" and r["booked_bytes"] == 64 * MiB
    assert r["backend"] == "cgroup1"
    assert set(r["counters"]) == {"oom_kill", "job_oom_events", "slice_oom_events"}  # type: ignore[arg-type]


def test_argv_reaches_the_job_intact(hostrun: Hostrun, tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    tricky = ["a b", "it's", 'say "hi"', "line1\nline2", "$(touch /tmp/pwned)", "`id`", "ünïcødé ✓",
              "*", "--", "-m", ""]
    code = f"import json, sys; json.dump(sys.argv[1:], open({str(out)!r}, 'w'))"
    proc = hostrun.run("-m", "64M", "--", PY, "-c", code, *tricky)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == tricky


def test_command_without_double_dash(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "64M", "sh", "-c", "echo $0 $1", "x", "y")
    assert proc.returncode == 0
    assert proc.stdout.strip() == "x y"


def test_missing_command_is_127_and_releases(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "64M", "--", "/nonexistent/tool")
    assert proc.returncode == 127
    assert "cannot run '/nonexistent/tool'" in proc.stderr


def test_over_own_cap_is_250_with_peak_near_cap(hostrun: Hostrun, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "100M", "--label", "hog", "--result-file", str(out), "--",
                       PY, "-c", "x = bytearray(300 << 20)")
    assert proc.returncode == 250, proc.stderr
    assert "own-cap" in proc.stderr
    r = result(out)
    assert r["outcome"] == "own-cap"
    assert r["counters"]["oom_kill"] >= 1 and r["counters"]["job_oom_events"] >= 1  # type: ignore[index]
    assert r["counters"]["slice_oom_events"] == 0  # type: ignore[index]
    assert 90 * MiB <= r["peak_bytes"] <= 100 * MiB  # type: ignore[operator]
    # The peak table marks the ceiling, so the next run is booked at its cap, not its peak.
    ledger = json.loads(hostrun.run("ledger", "--json").stdout)
    (peak,) = [p for p in ledger["peaks"] if p["label"] == "hog"]
    assert peak["hit_ceiling"] is True and peak["runs"] == 1


def test_own_cap_behind_a_shell_is_still_250(hostrun: Hostrun) -> None:
    """The exit status alone cannot tell (the shell exits 137 or 1); the counters decide."""
    proc = hostrun.run("-m", "100M", "--", "sh", "-c",
                       f"{PY} -c 'x = bytearray(300 << 20)'; echo after; exit 1")
    assert proc.returncode == 250
    assert "after" in proc.stdout


def test_slice_full_victim_gets_254_and_the_other_finishes(hostrun: Hostrun, tmp_path: Path) -> None:
    """Two gamble-booked jobs, each under its own cap (the slice), together overflow a 300M slice."""
    hostrun.configure(slice="300M", top='gamble_size = "50M"')
    ready = tmp_path / "a-ready"
    a_out, b_out = tmp_path / "a.json", tmp_path / "b.json"
    a = hostrun.popen("--label", "a", "--result-file", str(a_out), "--", PY, "-c",
                      f"import time, pathlib; x = bytearray(200 << 20); "
                      f"pathlib.Path({str(ready)!r}).touch(); time.sleep(4)")
    wait_for(ready.exists, timeout=20)
    b = hostrun.run("--label", "b", "--result-file", str(b_out), "--", PY, "-c",
                    "import time; x = bytearray(150 << 20); time.sleep(0.5)")
    a.wait(timeout=30)
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 254], (a.returncode, b.returncode, b.stderr)
    victim = result(a_out) if a.returncode == 254 else result(b_out)
    assert victim["outcome"] == "slice-full"
    assert victim["counters"]["slice_oom_events"] >= 1 and victim["counters"]["oom_kill"] >= 1  # type: ignore[index]


def test_admission_waits_for_room_instead_of_overcommitting(hostrun: Hostrun, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    first = hostrun.popen("-m", "200M", "--label", "first", "--", "sh", "-c",
                          f"echo first-start >> {marks}; sleep 1.5; echo first-end >> {marks}")
    wait_for(lambda: marks.exists() and "first-start" in marks.read_text())
    second = hostrun.run("-m", "200M", "--label", "second", "--", "sh", "-c",
                         f"echo second-start >> {marks}")
    first.wait(timeout=30)
    assert first.returncode == 0 and second.returncode == 0
    assert marks.read_text().split() == ["first-start", "first-end", "second-start"]
    assert "waiting: 200 MiB needed" in second.stderr and "held by first" in second.stderr


def test_never_fits_is_243_at_once(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "1G", "--", "true")
    assert proc.returncode == 243
    assert "larger than the whole slice" in proc.stderr
    assert hostrun.bookings() == []


def test_max_runtime_is_253(hostrun: Hostrun, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    started = time.monotonic()
    proc = hostrun.run("-m", "64M", "--max-runtime", "0.5s", "--result-file", str(out), "--",
                       "sleep", "30")
    assert proc.returncode == 253
    assert time.monotonic() - started < 20
    assert result(out)["outcome"] == "max-runtime"


def test_host_max_runtime_applies_and_the_option_overrides_it(hostrun: Hostrun, tmp_path: Path) -> None:
    """``[hosts.local] max_runtime`` stops a job that gives none (253); ``--max-runtime`` beats it."""
    hostrun.configure(host='max_runtime = "1s"')
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "64M", "--result-file", str(out), "--", "sleep", "30")
    assert proc.returncode == 253, proc.stderr
    assert result(out)["outcome"] == "max-runtime"
    proc = hostrun.run("-m", "64M", "--max-runtime", "1h", "--", "sleep", "2")
    assert proc.returncode == 0, proc.stderr


def test_max_runtime_kills_a_job_that_ignores_sigterm(hostrun: Hostrun) -> None:
    started = time.monotonic()
    proc = hostrun.run("-m", "64M", "--max-runtime", "0.5s", "--", "sh", "-c",
                       "trap '' TERM; sleep 30 & wait; sleep 30")
    assert proc.returncode == 253
    assert time.monotonic() - started < 20  # kill_grace is 2 s in the test config


def test_setsid_child_is_killed_with_the_job(hostrun: Hostrun, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    proc = hostrun.run("-m", "64M", "--", "sh", "-c",
                       f"setsid sleep 300 > /dev/null 2>&1 & echo $! > {pidfile}; exit 0")
    assert proc.returncode == 0
    pid = int(pidfile.read_text())
    wait_for(lambda: not pid_alive(pid), timeout=5)


def test_sigkill_of_hostrun_stops_the_job_and_releases_the_booking(hostrun: Hostrun, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    proc = hostrun.popen("-m", "64M", "--", "sh", "-c",
                         f"sleep 300 & echo $! >> {pidfile}; setsid sleep 300 & echo $! >> {pidfile}; wait")
    wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert hostrun.bookings(), "the job should be booked while it runs"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    # The guardian does this on its own, without any later hostrun noticing.
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=5)
    wait_for(lambda: hostrun.bookings() == [] and hostrun.job_dirs() == [], timeout=5)
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0


def test_sigint_is_forwarded_to_the_job(hostrun: Hostrun, tmp_path: Path) -> None:
    started = tmp_path / "started"
    proc = hostrun.popen("-m", "64M", "--", "sh", "-c", f"touch {started}; exec sleep 30")
    wait_for(started.exists)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=15)
    assert proc.returncode == 128 + signal.SIGINT


def test_sigterm_while_waiting_leaves_the_queue(hostrun: Hostrun, tmp_path: Path) -> None:
    started = tmp_path / "started"
    holder = hostrun.popen("-m", "250M", "--", "sh", "-c", f"touch {started}; sleep 30")
    wait_for(started.exists)
    waiter = hostrun.popen("-m", "250M", "--label", "waiter", "--", "true")
    wait_for(lambda: any(b[1] == "waiter" and b[2] == "waiting" for b in hostrun.bookings()))
    waiter.send_signal(signal.SIGTERM)
    waiter.wait(timeout=10)
    assert waiter.returncode == 128 + signal.SIGTERM
    assert not any(b[1] == "waiter" for b in hostrun.bookings())
    holder.send_signal(signal.SIGTERM)
    holder.wait(timeout=15)


def test_a_signal_the_moment_the_booking_appears_still_ends_the_wait_cleanly(
        hostrun: Hostrun, tmp_path: Path) -> None:
    """Between writing its booking and waiting for room, hostrun holds SIGTERM/SIGHUP/SIGQUIT back:
    before, one sent the instant the row showed killed it outright (-15: no "nothing ran", the row
    left for someone else to reclaim), almost every time when sent from a tight poll of the ledger."""
    started = tmp_path / "started"
    holder = hostrun.popen("-m", "250M", "--", "sh", "-c", f"touch {started}; sleep 60")
    wait_for(started.exists)
    db = hostrun.state_dir / "ledger.sqlite3"
    codes = []
    for i, sig in enumerate([signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT] * 4):
        waiter = hostrun.popen("-m", "250M", "--label", f"w{i}", "--", "true")
        con = sqlite3.connect(db, timeout=30)
        try:
            while not con.execute("SELECT 1 FROM bookings WHERE label = ?", (f"w{i}",)).fetchall():
                pass  # as tight as it gets: the signal goes the moment the row is there
        finally:
            con.close()
        waiter.send_signal(sig)
        waiter.wait(timeout=20)
        codes.append((sig.name, waiter.returncode))
        wait_for(lambda i=i: not any(b[1] == f"w{i}" for b in hostrun.bookings()))
    assert codes == [(sig.name, 128 + sig) for sig in [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT] * 4]
    holder.send_signal(signal.SIGTERM)
    holder.wait(timeout=15)


def test_peak_is_recorded_and_books_the_next_run(hostrun: Hostrun, tmp_path: Path) -> None:
    code = "import time; x = bytearray(60 << 20); x[::4096] = b'x' * len(x[::4096]); time.sleep(0.5)"
    out1, out2 = tmp_path / "1.json", tmp_path / "2.json"
    assert hostrun.run("-m", "200M", "--label", "p", "--result-file", str(out1), "--",
                       PY, "-c", code).returncode == 0
    first = result(out1)
    assert first["booking_kind"] == "cap"
    assert 55 * MiB <= first["peak_bytes"] < 200 * MiB  # type: ignore[operator]
    assert hostrun.run("-m", "200M", "--label", "p", "--result-file", str(out2), "--",
                       PY, "-c", code).returncode == 0
    second = result(out2)
    assert second["booking_kind"] == "peak"
    assert second["booked_bytes"] == first["peak_bytes"]
    assert second["cap_bytes"] == 200 * MiB


def test_gamble_booking_without_cap_or_history(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(slice="300M", top='gamble_size = "32M"')
    out = tmp_path / "r.json"
    code = "print(open('/proc/self/oom_score_adj').read().strip())"
    proc = hostrun.run("--result-file", str(out), "--", PY, "-c", code)
    assert proc.returncode == 0
    assert proc.stdout.strip() == "1000"
    r = result(out)
    assert r["booking_kind"] == "gamble" and r["booked_bytes"] == 32 * MiB
    assert r["cap_bytes"] == 300 * MiB


def test_cap_booking_gets_oom_score_adj_zero(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "64M", "--", "cat", "/proc/self/oom_score_adj")
    assert proc.stdout.strip() == "0"


def test_job_runs_inside_its_capped_cgroup(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "64M", "--", "sh", "-c",
                       "grep memory /proc/self/cgroup; "
                       "cat /sys/fs/cgroup/memory$(grep memory /proc/self/cgroup | cut -d: -f3)"
                       "/memory.limit_in_bytes")
    line, limit = proc.stdout.split()
    assert line.split(":", 2)[2].startswith(hostrun.cgroup + "/job-")
    assert int(limit) == 64 * MiB


def test_slice_limit_and_swap_are_set(hostrun: Hostrun) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    assert int((hostrun.slice_dir / "memory.limit_in_bytes").read_text()) == 300 * MiB
    memsw = hostrun.slice_dir / "memory.memsw.limit_in_bytes"
    if memsw.exists():
        assert int(memsw.read_text()) == 300 * MiB


def test_heavy_thread_environment(hostrun: Hostrun) -> None:
    hostrun.configure(slice="300M", host="heavy_threads = 7")
    show = "echo $HOSTRUN_THREADS $MAKEFLAGS $CARGO_BUILD_JOBS $CMAKE_BUILD_PARALLEL_LEVEL"
    assert hostrun.run("-m", "64M", "--", "sh", "-c", show).stdout.split() == ["7", "-j7", "7", "7"]
    env = {**os.environ, "MAKEFLAGS": "-j2"}
    assert hostrun.run("-m", "64M", "--", "sh", "-c", show, env=env).stdout.split() == ["7", "-j2", "7", "7"]
    forced = hostrun.run("-m", "64M", "--threads", "3", "--", "sh", "-c", show, env=env)
    assert forced.stdout.split() == ["3", "-j3", "3", "3"]


def test_state_files_are_private(hostrun: Hostrun) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    assert (hostrun.state_dir.stat().st_mode & 0o777) == 0o700
    for name in ("ledger.sqlite3", "ledger.sqlite3-wal", "wake"):
        path = hostrun.state_dir / name
        if path.exists():
            assert (path.stat().st_mode & 0o077) == 0, name
    assert (hostrun.state_dir / "ledger.sqlite3").exists()


def test_sigkill_of_hostrun_with_no_cap_still_stops_the_job(hostrun: Hostrun, tmp_path: Path) -> None:
    """Without a cgroup the guardian tracks the job by its process group."""
    hostrun.configure(slice="300M", host='backend = "none"')
    pidfile = tmp_path / "pid"
    proc = hostrun.popen("--no-cap", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip())
    pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not pid_alive(pid), timeout=5)
    wait_for(lambda: hostrun.bookings() == [], timeout=5)


def test_result_file_is_written_for_hostruns_own_refusals(hostrun: Hostrun, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "1G", "--label", "big", "--result-file", str(out), "--", "true")
    assert proc.returncode == 243
    r = result(out)
    assert r["exit_code"] == 243 and r["outcome"] == "never-fits" and r["label"] == "big"
    assert "larger than the whole slice" in r["message"]  # type: ignore[operator]
    hostrun.configure(slice="300M", host='backend = "none"')
    proc = hostrun.run("--result-file", str(out), "--", "true")
    assert proc.returncode == 78 and result(out)["outcome"] == "not-run"


def test_result_file_keeps_argv_bytes_that_are_not_utf8(hostrun: Hostrun, tmp_path: Path) -> None:
    """``argv`` holds such bytes as lone surrogates (``jq`` shows U+FFFD); ``argv_b64`` holds them
    exactly, for a run and for a refusal alike."""
    import base64

    odd = b"caf\xe9-\xff\xfe"
    out = tmp_path / "r.json"
    run = [*hostrun.argv("-m", "64M", "--result-file", str(out), "--"), b"printf", b"%s", odd]
    proc = subprocess.run(run, capture_output=True, check=False)
    assert proc.returncode == 0 and proc.stdout == odd
    data = json.loads(out.read_text())
    assert [base64.b64decode(a) for a in data["argv_b64"]] == [b"printf", b"%s", odd]
    proc = subprocess.run([*hostrun.argv("-m", "1G", "--result-file", str(out), "--"), b"echo", odd],
                          capture_output=True, check=False)
    assert proc.returncode == 243
    assert [base64.b64decode(a) for a in json.loads(out.read_text())["argv_b64"]] == [b"echo", odd]


def test_script_without_interpreter_line_is_126(hostrun: Hostrun, tmp_path: Path) -> None:
    script = tmp_path / "noshebang"
    script.write_bytes(b"\x7fELF-not-really")
    script.chmod(0o755)
    proc = hostrun.run("-m", "64M", "--", str(script))
    assert proc.returncode == 126
    assert "cannot run" in proc.stderr


def test_command_is_searched_on_the_jobs_path_as_execvp_does(hostrun: Hostrun, tmp_path: Path) -> None:
    """hostrun's own PATH search (the child no longer calls os.execvpe): entries in order, a
    non-executable file or a directory of that name is passed over, a name with a slash is run as
    given; "not executable" (126) wins over "not found" (127) when nothing runs."""
    first, second, third = (tmp_path / d for d in ("first", "second", "third"))
    for d in (first, second, third):
        d.mkdir()
    (first / "tool").write_text("#!/bin/sh\necho wrong\n")  # not executable
    (second / "tool").mkdir()
    (third / "tool").write_text("#!/bin/sh\necho right \"$@\"\n")
    (third / "tool").chmod(0o755)
    search = os.pathsep.join(str(d) for d in (first, second, third))
    env = dict(os.environ, PATH=f"{search}{os.pathsep}{os.environ['PATH']}")
    proc = hostrun.run("-m", "64M", "--", "tool", "a b", env=env)
    assert (proc.returncode, proc.stdout) == (0, "right a b\n"), proc.stderr
    only_first = dict(env, PATH=f"{first}{os.pathsep}{os.environ['PATH']}")
    proc = hostrun.run("-m", "64M", "--", "tool", env=only_first)
    assert proc.returncode == 126 and "Permission denied" in proc.stderr
    proc = hostrun.run("-m", "64M", "--", "no-such-tool-here", env=env)
    assert proc.returncode == 127 and "No such file or directory" in proc.stderr
    proc = hostrun.run("-m", "64M", "--", str(third / "tool"), "x", env=dict(env, PATH=os.defpath))
    assert (proc.returncode, proc.stdout) == (0, "right x\n")


def test_nested_hostrun_runs_inside_the_enclosing_job(hostrun: Hostrun, tmp_path: Path) -> None:
    """An inner hostrun does not book again nor leave the outer cap: it runs in the outer cgroup."""
    inner_out = tmp_path / "inner.json"
    inner = f"{PY} -m dispatch --config {hostrun.config_path}"
    script = (f"{inner} -m 200M -- sh -c 'grep memory /proc/self/cgroup'; "
              f"{inner} -m 200M --result-file {inner_out} -- sh -c 'exit 7'; echo inner=$?")
    proc = hostrun.run("-m", "100M", "--label", "outer", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    cgroup_line, status = proc.stdout.split()
    assert "/job-" in cgroup_line and status == "inner=7"
    r = result(inner_out)
    assert r["exit_code"] == 7 and "enclosing hostrun job" in r["message"]  # type: ignore[operator]
    assert cgroup_line.split(":", 2)[2] in r["cgroup"]  # type: ignore[operator]


def test_sigquit_while_waiting_leaves_the_queue(hostrun: Hostrun, tmp_path: Path) -> None:
    started = tmp_path / "started"
    holder = hostrun.popen("-m", "250M", "--", "sh", "-c", f"touch {started}; sleep 30")
    wait_for(started.exists)
    waiter = hostrun.popen("-m", "250M", "--label", "waiter", "--", "true")
    wait_for(lambda: any(b[1] == "waiter" for b in hostrun.bookings()))
    waiter.send_signal(signal.SIGQUIT)
    waiter.wait(timeout=10)
    assert waiter.returncode == 128 + signal.SIGQUIT
    assert "nothing ran" in waiter.stderr.read()  # type: ignore[union-attr]
    assert not any(b[1] == "waiter" for b in hostrun.bookings())
    holder.send_signal(signal.SIGTERM)
    holder.wait(timeout=15)


def test_ceiling_is_marked_even_when_the_job_survives_an_oom_kill(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "100M", "--label", "survivor", "--", "sh", "-c",
                       f"{PY} -c 'x = bytearray(300 << 20)'; exit 0")
    assert proc.returncode == 0
    assert "OOM-killed, but the job exited 0" in proc.stderr
    (peak,) = json.loads(hostrun.run("ledger", "--json").stdout)["peaks"]
    assert peak["hit_ceiling"] is True


def test_short_spike_is_caught_in_the_recorded_peak(hostrun: Hostrun, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = "x = b'x' * (80 << 20)"  # allocated, written and gone within a few milliseconds
    assert hostrun.run("-m", "200M", "--result-file", str(out), "--", PY, "-c", code).returncode == 0
    assert result(out)["peak_bytes"] >= 80 * MiB  # type: ignore[operator]


def test_interactive_job_reads_the_terminal(hostrun: Hostrun) -> None:
    """In a real pseudo-terminal, the job gets the foreground: it can read input (no SIGTTIN hang)."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - child
        os.execv(PY, hostrun.argv("-m", "64M", "--", "sh", "-c", "read line; echo got:$line"))
    os.write(fd, b"hello\n")
    output = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert b"got:hello" in output, output
    assert os.WEXITSTATUS(status) == 0


def test_ctrl_z_stops_the_job_and_hands_the_terminal_back(hostrun: Hostrun, tmp_path: Path) -> None:
    """In a real pseudo-terminal under an interactive bash: Ctrl-Z stops the job and hostrun, the
    shell gets its terminal back, and ``fg`` continues both (job control as a shell does it)."""
    import pty
    import select

    marker = tmp_path / "resumed"
    command = shlex.join(hostrun.argv("-m", "64M", "--", "sh", "-c",
                                      f"sleep 1; touch {marker}; echo finished-$((40+2))"))
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - child
        os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], {**os.environ, "PS1": "PROMPT> "})

    def read_until(needle: bytes, timeout: float = 20) -> bytes:
        seen = b""
        deadline = time.monotonic() + timeout
        while needle not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    break
        return seen

    try:
        read_until(b"PROMPT> ")
        os.write(fd, command.encode() + b"\n")
        time.sleep(0.5)
        os.write(fd, b"\x1a")  # Ctrl-Z
        stopped = read_until(b"PROMPT> ")
        assert b"Stopped" in stopped, stopped
        time.sleep(1.5)
        assert not marker.exists()  # stopped means stopped
        os.write(fd, b"fg\n")
        resumed = read_until(b"finished-42")  # the command line itself says finished-$((40+2))
        assert b"finished-42" in resumed, resumed
        assert marker.exists()
        os.write(fd, b"exit\n")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)


def test_the_guardian_holds_no_descriptor_but_its_own(tmp_path: Path) -> None:
    """The forked guardian must not keep hostrun's other descriptors open: the peer agent feeds a
    --stdin job through a pipe whose write end it closes on EOF, and a guardian forked before that
    held a copy for the whole run, so the job (``cat``) never saw EOF (found as a CI hang)."""
    import select

    from dispatch.local.run.guardian import Guardian

    read_end, write_end = os.pipe()
    class Job:  # the guardian keeps only these of the job's, and touches nothing else until EOF
        def held_fds(self) -> list[int]:
            return []

    guardian = Guardian.start(str(tmp_path), Job())  # type: ignore[arg-type]
    try:
        os.close(write_end)  # our copy: the only one, if the guardian took none
        readable, _, _ = select.select([read_end], [], [], 10)
        assert readable, "the guardian still holds the pipe's write end"
        assert os.read(read_end, 1) == b""
    finally:
        guardian.dismiss()
        os.close(read_end)


def test_max_runtime_is_kept_while_hostrun_is_stopped(hostrun: Hostrun, tmp_path: Path) -> None:
    """The deadline belongs to the job: hostrun stopped (SIGSTOP, as Ctrl-Z stops it) right after
    the start of a 2 s job; its guardian, in a session of its own, stops the job on time anyway, and
    hostrun, resumed, says 253 and why. (Before, a 3 s limit ran 21 s.)"""
    pidfile = tmp_path / "job.pid"
    proc = hostrun.popen("--max-runtime", "2s", "-m", "64M", "--", "sh", "-c",
                         f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 60")
    wait_for(pidfile.exists)
    os.kill(proc.pid, signal.SIGSTOP)
    job = int(pidfile.read_text())
    try:
        wait_for(lambda: not pid_alive(job), timeout=30, interval=0.1)  # hostrun still stopped
        assert proc.poll() is None
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 253, stderr
    assert "max runtime (2 s) passed while hostrun was stopped; its guardian stopped the job" in stderr

