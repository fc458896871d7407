"""Several users, one machine budget: a shared slice (``hostrun shared install``) on the VM's real
systemd, with two real normal users (``dev`` and ``dev2``, members of the group) and one who is not
(``dev3``), each running the installed hostrun under ``runuser`` (their own uid, groups and files).

What is checked, each against the user who would want more than their share: the two users' jobs
never hold more than the slice together (the second waits, first come first served, and is told
who holds the room); each sees the other's bookings, escaped; nobody can put another's process in a
scope, signal another's job, stop its scope or unbook it; a caller killed mid-job leaves nothing;
a process put in a scope without a booking is held to the waiting allowance; and the exit codes are
the kernel's (250, 254) on the shared slice. The module's fixture installs the daemon once and
uninstalls it at the end (the other VM tests expect no shared slice).
"""

from __future__ import annotations

import json
import shlex

from dispatch.core.units import MiB
from tests.conftest import wait_for
from tests.support.sharedvm import SLICE, User, _holder_script
from tests.support.sharedvm import shared as shared  # the module's fixture: installs, uninstalls


def test_doctor_names_the_shared_slice_and_who_cannot_use_it(shared: dict[str, User]) -> None:
    done = shared["dev"].run("doctor", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["backend"] == "shared", data
    assert data["slice_limit"] == SLICE
    assert data["slice"].startswith("hostrun.slice, shared through /run/hostrun/shared.sock")
    engine = data["admission_engine"]
    assert engine["socket"] == "/run/hostrun/shared.sock" and engine["pid"], engine
    assert "the shared slice's, running as root" in engine["detail"], engine
    outsider = shared["dev3"].run("doctor", "--json")
    probes = {p["backend"]: p for p in json.loads(outsider.stdout)["probes"]}
    assert not probes["shared"]["ok"]
    assert "Permission denied" in probes["shared"]["detail"], probes


def test_two_users_never_hold_more_than_the_slice(shared: dict[str, User]) -> None:
    """dev holds 300M of the 400M slice; dev2 asks for 300M and waits, told it is dev who holds the
    room; while it waits the listing (read by either user) shows 300M running and 300M waiting;
    once dev's job ends, dev2's runs."""
    dev, dev2 = shared["dev"], shared["dev2"]
    dev.sh(f"rm -f ready release; {_holder_script(dev, 300, 200, 'first')} > out 2> err & echo $! > pid")
    wait_for(lambda: dev.sh("test -e ready", check=False).returncode == 0, timeout=120, interval=0.5)
    dev2.sh(f"rm -f ready release; {_holder_script(dev2, 300, 10, 'second')} > out 2> err & "
            "echo $! > pid")
    wait_for(lambda: "held by dev:first" in dev2.sh("cat err").stdout, timeout=60, interval=0.5)
    for reader in (dev, dev2):
        listing = reader.status()
        states = {b["label"]: (b["user"], b["state"], b["size"]) for b in listing["bookings"]}
        assert states == {"first": ("dev", "running", 300 * MiB),
                          "second": ("dev2", "waiting", 300 * MiB)}, listing
        assert listing["limit"] == SLICE
    assert dev2.sh("test -e ready", check=False).returncode != 0  # never started
    dev.sh("touch release; while kill -0 $(cat pid) 2>/dev/null; do sleep 0.2; done")
    wait_for(lambda: dev2.sh("test -e ready", check=False).returncode == 0, timeout=60, interval=0.5)
    dev2.sh("touch release; while kill -0 $(cat pid) 2>/dev/null; do sleep 0.2; done")
    assert "waiting" in dev2.sh("cat err").stdout
    assert shared["dev"].status()["bookings"] == []


def test_nobody_can_take_stop_or_unbook_anothers_job(shared: dict[str, User]) -> None:
    """dev runs a job; dev2 tries what a group member can: a scope around dev's process through the
    daemon, a signal, ``systemctl stop`` of its scope. And dev2's own client books under a label with
    a terminal escape (hostrun itself refuses such labels; the daemon's socket is open to any member's
    own program): dev's listing shows it escaped."""
    dev, dev2 = shared["dev"], shared["dev2"]
    dev.sh(f"rm -f ready release; {_holder_script(dev, 100, 10, 'mine')} > out 2> err & echo $! > pid")
    wait_for(lambda: dev.sh("test -e ready", check=False).returncode == 0, timeout=120, interval=0.5)
    (booking,) = dev2.status()["bookings"]
    assert booking["label"] == "mine" and booking["user"] == "dev" and booking["state"] == "running"
    job_pid = int(dev.sh("cat ready").stdout)
    client = ("import json, marshal, os, socket, time\n"
              "s = socket.socket(socket.AF_UNIX); s.connect('/run/hostrun/shared.sock')\n"
              "f = s.makefile('rb')\n"
              "def ask(m):\n    s.sendall(json.dumps(m).encode() + b'\\n')\n"
              "def read():\n    return marshal.loads(f.read(int.from_bytes(f.read(4), 'big')))\n"
              "start = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
              "ask({'op': 'plan', 'run': {'host': 'local', 'label': 'evil\\x1b[2Jlabel', "
              "'pid': os.getpid(), 'pid_start': start, 'cap': 10 << 20, 'no_cap': False, "
              "'program': 'x', 'command': 'x', 'session': None, 'group': None, 'when_idle': False, "
              "'booking_id': None, 'requeue': False, 'gamble': 10 << 20, 'gpu': None}})\n"
              "queued = read()\n"
              "while read().get('op') != 'admitted': pass\n"
              f"ask({{'op': 'scope', 'id': queued['id'], 'pids': [{job_pid}]}})\n"
              "print('refused:', read().get('error'), flush=True)\n"
              "print('admitted', flush=True)\n"
              "while not os.path.exists('release'): time.sleep(0.1)\n")
    dev2.sh("rm -f release booked; cat > client.py", input=client)
    dev2.sh("python3 client.py > booked 2>&1 &")
    wait_for(lambda: "admitted" in dev2.sh("cat booked").stdout, timeout=60, interval=0.5)
    assert f"refused: process {job_pid} is not a child of the caller" in dev2.sh("cat booked").stdout
    shown = dev.run("shared", "status").stdout
    assert "evil\\x1b[2Jlabel" in shown and "\x1b" not in shown, shown
    assert {b["label"] for b in dev.status()["bookings"]} == {"mine", "evil\x1b[2Jlabel"}
    assert dev2.sh(f"kill -KILL {job_pid}", check=False).returncode != 0
    stop = dev2.sh(f"systemctl stop {booking['unit']} </dev/null", check=False)
    assert stop.returncode != 0
    assert dev.sh(f"kill -0 {job_pid} && echo alive").stdout.strip() == "alive"
    mine = [b for b in dev2.status()["bookings"] if b["label"] == "mine"]
    assert [b["state"] for b in mine] == ["running"]
    dev2.sh("touch release")
    dev.sh("touch release; while kill -0 $(cat pid) 2>/dev/null; do sleep 0.2; done")
    wait_for(lambda: dev.status()["bookings"] == [], timeout=30, interval=0.5)


def test_a_killed_hostrun_leaves_no_booking_and_no_job(shared: dict[str, User]) -> None:
    dev = shared["dev"]
    dev.sh(f"rm -f ready release; {_holder_script(dev, 100, 10, 'killed')} > out 2> err & echo $! > pid")
    wait_for(lambda: dev.sh("test -e ready", check=False).returncode == 0, timeout=120, interval=0.5)
    (booking,) = dev.status()["bookings"]
    job_pid = int(dev.sh("cat ready").stdout)
    dev.sh("kill -KILL $(cat pid)")
    wait_for(lambda: dev.status()["bookings"] == [], timeout=30, interval=0.5)
    scope = f"/sys/fs/cgroup/hostrun.slice/{booking['unit']}"
    wait_for(lambda: dev.sh(f"test -e {scope}", check=False).returncode != 0, timeout=30, interval=0.5)
    assert dev.sh(f"kill -0 {job_pid}", check=False).returncode != 0  # the job is gone too


def test_no_scope_without_an_admitted_booking(shared: dict[str, User]) -> None:
    """A client of its own asks for a scope around its child without an admitted booking: refused,
    and no scope is started (a process in the shared slice never runs unbooked)."""
    dev2 = shared["dev2"]
    script = ("import json, marshal, os, socket, time\n"
              "pid = os.fork()\n"
              "if pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
              "s = socket.socket(socket.AF_UNIX); s.connect('/run/hostrun/shared.sock')\n"
              "f = s.makefile('rb')\n"
              "s.sendall(json.dumps({'op': 'scope', 'id': 1, 'pids': [pid]}).encode() + b'\\n')\n"
              "print(marshal.loads(f.read(int.from_bytes(f.read(4), 'big'))).get('error'))\n"
              "os.kill(pid, 9)\n")
    dev2.sh("cat > rogue.py", input=script)
    assert "is not an admitted booking of this connection" in dev2.sh("python3 rogue.py").stdout
    units = dev2.vm.ssh("root", "systemctl list-units --all --no-legend 'hostrun-shared-*.scope'").stdout
    assert units.strip() == "", units


def test_exact_codes_on_the_shared_slice(shared: dict[str, User]) -> None:
    """250 at the job's own cap, 254 when the shared slice is full (dev holds 300M booked at its cap
    and uses 250M; dev2's gamble, booked 50M, takes 150M)."""
    dev, dev2 = shared["dev"], shared["dev2"]
    hog = shlex.join(["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"])
    loop = f"for i in 1 2 3 4 5; do {dev2.cmd('-m', '20M', '--', *shlex.split(hog))} >/dev/null 2>&1; " \
           "echo $?; done"
    assert dev2.sh(loop).stdout.split() == ["250"] * 5
    dev.sh(f"rm -f ready release; {_holder_script(dev, 300, 250, 'big')} > out 2> err & echo $! > pid")
    wait_for(lambda: dev.sh("test -e ready", check=False).returncode == 0, timeout=120, interval=0.5)
    victim = dev2.cmd("--label", "VICTIM", "--", "dd", "if=/dev/zero", "of=/dev/null", "bs=150M",
                      "count=1").replace("VICTIM", "victim-$i")
    codes = dev2.sh(f"for i in 1 2 3; do {victim} >/dev/null 2>&1; echo $?; done").stdout.split()
    dev.sh("touch release; while kill -0 $(cat pid) 2>/dev/null; do sleep 0.2; done")
    assert codes == ["254"] * 3
    assert dev.status()["bookings"] == []


def test_a_member_never_runs_outside_an_installed_slice_whose_daemon_is_gone(
        shared: dict[str, User]) -> None:
    """Daemon stopped (its socket removed, as after a start-limit hit), then stalled (SIGSTOP: the
    socket still accepts): a member's run ends 78 with the line naming what the administrator runs,
    and nothing ran; ``backend = "systemd"`` runs it in the member's own slice and says so; a
    non-member (dev3) is not held to a slice that is not theirs (the usual chain). Last here: it
    stops the daemon."""
    dev, dev3 = shared["dev"], shared["dev3"]
    vm = dev.vm
    vm.ssh("root", "systemctl stop hostrun-shared.socket hostrun-shared.service; "
                   "test ! -e /run/hostrun/shared.sock")
    try:
        done = dev.run("-m", "50M", "--", "touch", f"{dev.dir}/ran")
        assert done.returncode == 78, (done.returncode, done.stderr)
        assert "shared slice of group hostrun-shared is installed here but not usable" in done.stderr
        assert "systemctl reset-failed hostrun-shared.socket" in done.stderr
        assert "Traceback" not in done.stderr
        assert dev.sh(f"test -e {dev.dir}/ran", check=False).returncode == 1  # nothing ran
        outsider = dev3.run("-m", "50M", "--", "true")  # dev3 has no user manager: no backend
        assert outsider.returncode == 78, outsider.stderr
        assert "no memory-cap backend works on this host" in outsider.stderr
        assert "shared slice" not in outsider.stderr
        opt_out = f"{dev.dir}/own.toml"
        dev.sh(f"sed 's/^slice = .*/&\\nbackend = \"systemd\"/' {dev.config} > {opt_out}")
        vm.ssh("root", "systemctl start user@$(id -u dev).service")  # dev's own manager
        own = dev.sh('XDG_RUNTIME_DIR=/run/user/$(id -u) ' + shlex.join(
            ["hostrun", "--config", opt_out, "-m", "50M", "--", "true"]), check=False)
        assert own.returncode == 0, own.stderr
        assert "running outside the shared slice of group hostrun-shared" in own.stderr
        vm.ssh("root", "systemctl start hostrun-shared.socket && "
                       "systemctl start hostrun-shared.service && "
                       "systemctl kill -s SIGSTOP hostrun-shared.service")
        stalled = dev.run("-m", "50M", "--", "touch", f"{dev.dir}/ran")
        assert stalled.returncode == 78, (stalled.returncode, stalled.stderr)
        assert "no answer from the shared slice's engine" in stalled.stderr, stalled.stderr
        assert "not usable" in stalled.stderr
        assert dev.sh(f"test -e {dev.dir}/ran", check=False).returncode == 1
    finally:
        vm.ssh("root", "systemctl kill -s SIGCONT hostrun-shared.service; "
                       "systemctl reset-failed hostrun-shared.socket hostrun-shared.service; "
                       "systemctl start hostrun-shared.socket", check=False)
    assert dev.status()["bookings"] == []
