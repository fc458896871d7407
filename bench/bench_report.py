#!/usr/bin/env python3
"""``hostrun report`` for two hosts (this one + a real sshd peer) against a plain ``ssh peer true``,
warm (through a ControlMaster) and cold (no master yet), measured in the same run.

What is measured
----------------
One real OpenSSH peer is started with ``tests/support/sshd.py``'s ``SshdPeer`` on a loopback address
(127.0.0.2 by default): its own sshd, host key, user key, known_hosts, ssh_config, hostrun config,
state dir and slice cgroup. The controller's private config names ``local`` and that peer.

Warm (a ControlMaster is up; hostrun's own, at ``dispatch.hosts.ssh.transport.control_dir(state_dir)/%C``):

* ``hostrun --config C report --json`` (both hosts)            -- the target series
* ``hostrun --config C report`` (both hosts, rendered with rich) -- shown with its own ratio
* baseline: ``ssh -F PEER_SSH_CONFIG -o ControlPath=<hostrun's> peer1 true``, through the same master
* for information: ``report --json --host peer1`` (peer only), ``report --json --host local`` (local
  only), the agent command exactly as hostrun sends it, run with plain ``ssh`` through the same master
  (the peer's share: its shell + ``python3 -I <agent dir> report``), the agent run directly on this
  machine with the peer's environment (no ssh), and, unless ``--no-cached-series``, ``report --json``
  with dispatch's bytecode cached (private ``PYTHONPYCACHEPREFIX``, ``PYTHONDONTWRITEBYTECODE`` unset);
* floors, for information: ``python -c pass`` (hostrun's interpreter), ``ssh peer1 python3 -I -c pass``
  through the master (their sum is the least any Python controller + per-call Python agent can cost)
  and ``python -c 'import asyncio'`` (for reference: the report path no longer imports it).

Warm, ``report --json`` goes through the peer's report daemon (``agent serve``, reached over a socket
the master forwards; started in the warm-up); the same with ``agent_idle = 0`` (a second config, the
same state dir and master) is the per-call agent over ssh, the "before" series.

Target: median of ``report --json`` <= 5x the median of the warm ``ssh peer1 true`` (issue 13;
issue 3 had asked for 3x, below the ~3.5x floor of any per-call Python agent).
``--target-on rich`` judges the rendered form instead.

Cold (the master is stopped with ``ssh -O exit`` before every run of both series, and the bench waits
until no process with hostrun's ControlPath is left):

* ``hostrun --config C report --json`` (both hosts; its first ssh starts a new master)  -- the target
* baseline: ``ssh -F PEER_SSH_CONFIG -o ControlMaster=no -o ControlPath=none peer1 true``

Target: ratio of medians <= 1.5x. The agent is sent to the peer in the warm-up, before anything is
timed; at the end its file's mtime and the set of agent files on the peer are checked, so an upload
counted as report time (a re-send, or a new agent because dispatch/ was edited during the run) fails
the bench. ``--snapshot`` runs hostrun on a copy of ``dispatch/`` (with its ``__pycache__``) taken at the
start, first on ``PYTHONPATH``, for a tree that is being edited while the bench runs.

All series of a phase are interleaved, the order rotating every round, so all share the machine's
noise. Reported: median, p10, p90, min, max; the ratios; the per-host ``elapsed_s`` hostrun itself
reports in the ``--json`` runs; and the top entries of ``python -X importtime -m dispatch --config C
report [--json]`` (median of 5 runs by total import time). That profile is distorted where the local
report's worker thread and the event loop import at the same time (``-X importtime`` keeps one
nesting count for all threads: negative self times), so the same modules are also profiled imported
in one thread (``-c "import dispatch.cli.main, dispatch.placement.reports, dispatch.hosts.ssh.peer,
dispatch.local.report"``).

Isolation: a private temporary directory with the controller's config (own ``state_dir``, own slice
cgroup ``<this process's memory cgroup>/hostrun-bench-<pid>``, own ``XDG_CACHE_HOME``) and the peer
(its slice cgroup ``<this process's memory cgroup>/hostrun-bench-peer1-<pid>``). In a ``finally``
block: the report daemon is stopped and checked gone (no process, socket or lock; anything left is
a failure), the ControlMaster is stopped (``ssh -O exit``, then any process still carrying this run's
ControlPath is killed by pid), sshd and everything below it is stopped, both slice cgroups and the
directory are removed. Bookings, job cgroups or processes left behind are reported first as a failure.

Needs root, ``/usr/sbin/sshd`` (openssh-server), the ``ssh`` client and a memory-cap backend (cgroup
v1 on the reference machines). Standard library only (plus the repository's own
``tests/support/sshd.py`` and ``dispatch.hosts.ssh.transport.control_dir``/``dispatch.hosts.ssh.bundle``/
``dispatch.hosts.ssh.peer`` for the exact paths and command hostrun uses). Run by hand, e.g.::

    .venv/bin/python bench/bench_report.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from _common import (  # noqa: E402 - after the sys.path set-up above
    cgroup_leftovers,
    find_hostrun,
    interpreter_of,
    ledger_leftovers,
    own_memory_cgroup,
    private_env,
    remove_slice,
    sources_digest,
    startup_hooks,
)

from dispatch.hosts.ssh.transport import control_dir, remote_command  # noqa: E402
from tests.support.sshd import SshdPeer  # noqa: E402

WARM_TARGET = 5.0  # issue 13: warm two-host report --json <= 5x a warm ssh true
COLD_TARGET = 1.5
MEMORY_MOUNT = "/sys/fs/cgroup/memory"
PEER = "peer1"


# ---------------------------------------------------------------- shared setup helpers














def pct(values: list[float], q: int) -> float:
    """q-th percentile (inclusive method), q in 1..99."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]




# ---------------------------------------------------------------- ssh master handling
def pids_with(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (this run's private control dir)."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry))
    return found


def master_check(ssh_base: list[str]) -> str:
    proc = subprocess.run([*ssh_base, "-O", "check", PEER], capture_output=True, text=True, timeout=10)
    return (proc.stderr.strip() or proc.stdout.strip()) if proc.returncode == 0 else ""


def stop_master(ssh_base: list[str], ctl_dir: str, kill: bool = False) -> None:
    """``ssh -O exit``; then wait until no process carries this run's ControlPath (kill by pid at the
    end, or when ``kill``)."""
    subprocess.run([*ssh_base, "-O", "exit", PEER], capture_output=True, timeout=10, check=False)
    marker = f"ControlPath={ctl_dir}"
    deadline = time.monotonic() + (0.5 if kill else 5.0)
    while pids_with(marker) and time.monotonic() < deadline:
        time.sleep(0.005)
    for pid in pids_with(marker):
        if not kill:
            print(f"bench: warning: ssh process {pid} still up after -O exit; killing it", file=sys.stderr)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def stop_daemons(peer: SshdPeer) -> list[str]:
    """SIGTERM the peer's report daemons; what they leave (process, socket, lock) is a failure."""
    for pid in peer.daemon_pids():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while peer.daemon_leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    return [f"{PEER}: report daemon left {item}" for item in peer.daemon_leftovers()]


# ---------------------------------------------------------------- the benchmark
class Series:
    def __init__(self, key: str, label: str, argv: list[str], env: dict[str, str],
                 before: Callable[[], None] | None = None, parse_json: bool = False) -> None:
        self.key, self.label, self.argv, self.env = key, label, argv, env
        self.before = before  # a callable run (untimed) before every timed run
        self.parse_json = parse_json
        self.times: list[float] = []
        self.elapsed: dict[str, list[float]] = {}
        self.failures: list[str] = []

    def run_once(self, i: int) -> None:
        if self.before is not None:
            self.before()
        t0 = time.perf_counter()
        proc = subprocess.run(self.argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True)
        self.times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()[-300:]
            self.failures.append(f"run {i} {self.key}: exit {proc.returncode}: {err}")
            return
        if self.parse_json:
            try:
                hosts = json.loads(proc.stdout)["hosts"]
            except (ValueError, KeyError) as exc:
                self.failures.append(f"run {i} {self.key}: no JSON: {exc}")
                return
            for h in hosts:
                if not h["ok"]:
                    self.failures.append(f"run {i} {self.key}: host {h['host']}: {h['error']}")
                self.elapsed.setdefault(h["host"], []).append(h["elapsed_s"])


def run_phase(series: list[Series], runs: int) -> None:
    for i in range(runs):
        k = i % len(series)
        for s in series[k:] + series[:k]:  # rotate: share the noise
            s.run_once(i)


def print_table(title: str, series: list[Series]) -> dict[str, float]:
    print(f"\n{title}; wall time in ms")
    print(f"  {'':52} {'median':>8} {'p10':>8} {'p90':>8} {'min':>8} {'max':>8}")
    med = {}
    for s in series:
        v = s.times
        med[s.key] = statistics.median(v)
        print(f"  {s.label:52} {med[s.key] * 1000:8.1f} {pct(v, 10) * 1000:8.1f} "
              f"{pct(v, 90) * 1000:8.1f} {min(v) * 1000:8.1f} {max(v) * 1000:8.1f}")
    for s in series:
        if s.elapsed:
            parts = ", ".join(f"{host} {statistics.median(v) * 1000:.1f} ms"
                              for host, v in s.elapsed.items())
            print(f"    {s.key}: hostrun's own elapsed_s per host (median): {parts}")
    return med


REPORT_PATH_MODULES = (
    "import dispatch.cli.main, dispatch.placement.reports, dispatch.hosts.ssh.peer, dispatch.local.report")


def importtime_profile(python: str, args: list[str], shown: str, env: dict[str, str], top: int,
                       repeat: int = 5) -> None:
    """One ``-X importtime`` run is noisy: run it ``repeat`` times and show the median run."""
    argv = [python, "-X", "importtime", *args]
    runs = []
    for _ in range(repeat):
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        rows: list[tuple[int, int, str]] = []
        other: list[str] = []
        for line in proc.stderr.decode("utf-8", "replace").splitlines():
            if not line.startswith("import time:"):
                other.append(line)
                continue
            parts = line[len("import time:"):].split("|")
            try:
                rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
            except (ValueError, IndexError):
                continue  # the header line
        top_level = [r for r in rows if not r[2].startswith("  ")]  # "| name", nested: "|   name"
        runs.append((sum(r[1] for r in top_level), proc.returncode, rows, other))
    runs.sort(key=lambda r: r[0])
    total_top, returncode, rows, other = runs[len(runs) // 2]
    print(f"\nImport-time profile, {shown} (median of {repeat} runs by total):")
    print(f"  {os.path.basename(python)} -X importtime {' '.join(args)}  (exit {returncode})")
    if not rows:
        print("  (no importtime output)")
        return

    def family(prefix: str) -> float:
        return sum(r[0] for r in rows if r[2].strip().split(".")[0] == prefix) / 1000

    print(f"  {len(rows)} modules imported, {total_top / 1000:.1f} ms in all (sum of top-level "
          f"cumulative); own time of dispatch.* {family('dispatch'):.1f} ms, asyncio.* "
          f"{family('asyncio'):.1f} ms, rich.* {family('rich'):.1f} ms, "
          f"pydantic* {family('pydantic') + family('pydantic_core'):.1f} ms")
    if any(r[0] < 0 for r in rows):
        print("  (negative self times: modules were imported by two threads at once -- the local "
              "report's reader threads -- and -X importtime's accounting "
              "is not per thread; see the single-thread profile of the same modules)")
    if top > 0:
        print(f"  top {top} by cumulative time:")
        print(f"  {'cumul ms':>9} {'self ms':>8}  module")
        for self_us, cum_us, name in sorted(rows, key=lambda r: -r[1])[:top]:
            print(f"  {cum_us / 1000:9.1f} {self_us / 1000:8.1f}  {name}")
    if other and returncode != 0:
        print("  stderr besides importtime:")
        for line in other[:10]:
            print(f"    {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="measured runs of each series (>= 20)")
    ap.add_argument("--hostrun", metavar="PATH",
                    help="hostrun executable (default: <dir of sys.executable>/hostrun)")
    ap.add_argument("--address", default="127.0.0.2", help="loopback address of the peer's sshd")
    ap.add_argument("--top", type=int, default=15, help="import-time entries to show (default 15)")
    ap.add_argument("--target-on", choices=("json", "rich"), default="json",
                    help="which form of `hostrun report` the targets judge (default json)")
    ap.add_argument("--snapshot", action="store_true",
                    help="run hostrun on a copy of dispatch/ taken at the start (PYTHONPATH), so edits "
                         "to the tree during the run cannot change the code measured")
    ap.add_argument("--no-cached-series", action="store_true",
                    help="skip the series with a private bytecode cache (PYTHONPYCACHEPREFIX)")
    args = ap.parse_args()
    if args.runs < 20:
        ap.error("--runs must be at least 20 (medians of >= 20 runs)")
    if os.geteuid() != 0:
        sys.exit("bench: needs root (sshd privilege separation, memory cgroups)")
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("ssh") is None:
        sys.exit("bench: needs /usr/sbin/sshd (openssh-server) and the ssh client")

    hostrun = find_hostrun(args.hostrun)
    python = interpreter_of(hostrun)
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-report-")
    own = (own_memory_cgroup() or "").rstrip("/")
    slice_rel = f"{own}/hostrun-bench-{os.getpid()}"
    peer_rel = f"{own}/hostrun-bench-{PEER}-{os.getpid()}"
    mount_ok = os.path.isdir(MEMORY_MOUNT)
    slice_dir = MEMORY_MOUNT + slice_rel if mount_ok else None
    peer_slice_dir = MEMORY_MOUNT + peer_rel if mount_ok else None
    state_dir = os.path.join(tmp, "state")
    ctl_dir = control_dir(state_dir)
    peer: SshdPeer | None = None
    ssh_base: list[str] = []
    cwd = os.getcwd()
    os.chdir(tmp)  # `python -m dispatch` / `-c` put the cwd first on sys.path: not the repository's
    try:
        root = Path(tmp) / f"peer-{PEER}"
        root.mkdir()
        peer = SshdPeer(root, PEER, args.address, peer_rel, slice="300M")
        peer.start()
        config = os.path.join(tmp, "hosts.toml")
        per_call_config = os.path.join(tmp, "hosts-per-call.toml")
        for path, extra in ((config, ""), (per_call_config, "agent_idle = 0\n")):
            with open(path, "w", encoding="utf-8") as fh:  # the same state_dir: the same master
                fh.write(f'state_dir = "{state_dir}"\n{extra}\n[hosts.local]\nslice = "300M"\n'
                         f'cgroup = "{slice_rel}"\n\n{peer.host_table()}')
        env = private_env(tmp)
        code_root = REPO
        if args.snapshot:  # hostrun imports this copy of dispatch/ (PYTHONPATH comes before the .pth)
            code_root = os.path.join(tmp, "snapshot")
            # with its __pycache__ and the sources' mtimes: the same bytecode state as the tree
            shutil.copytree(os.path.join(REPO, "dispatch"), os.path.join(code_root, "dispatch"))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (code_root, env.get("PYTHONPATH")) if p)
        env_cached = dict(env, PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        env_cached.pop("PYTHONDONTWRITEBYTECODE", None)
        ssh_cfg = str(peer.ssh_config)
        ssh_base = ["ssh", "-F", ssh_cfg, "-o", f"ControlPath={os.path.join(ctl_dir, '%C')}"]
        # The agent's name (content hash of the core hostrun sends) and the remote script that runs
        # it, from the code hostrun runs (the snapshot, with --snapshot).
        agent_rel, run_script = json.loads(subprocess.run(
            [python, "-c", "import json; from dispatch.hosts.ssh.bundle import remote_path; "
                           "from dispatch.hosts.ssh.peer import _RUN; "
                           "print(json.dumps([remote_path(), _RUN]))"],
            env=env, capture_output=True, text=True, check=True).stdout)
        agent_file = peer.home / agent_rel
        peer_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(peer.home),
                    "HOSTRUN_CONFIG": str(peer.peer_config),
                    "XDG_CACHE_HOME": str(peer.home / ".cache"), "PYTHONDONTWRITEBYTECODE": "1"}
        peer_python = shutil.which("python3", path=peer_env["PATH"]) or "python3"

        version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip()
        peer_version = subprocess.run([peer_python, "-c", "import sys; print(sys.version.split()[0])"],
                                      capture_output=True, text=True).stdout.strip()
        ssh_version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
        print(f"hostrun:      {hostrun}")
        print(f"interpreter:  {python} (Python {version})")
        print(f"config:       {config} (state_dir {state_dir}; hosts local + {PEER})")
        print(f"slices:       local {slice_dir or '(hostrun default)'}\n"
              f"              {PEER} {peer_slice_dir or '(hostrun default)'}")
        print(f"peer:         sshd on {peer.address}:{peer.port} (this machine; ssh_config {ssh_cfg}); "
              f"agent runs on {peer_python} (Python {peer_version})")
        print(f"control path: {ctl_dir}/%C  ({ssh_version})")
        print(f"machine:      {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        print(f"start hooks:  {startup_hooks(python)}")
        print(f"environment:  PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
        print(f"code:         {code_root}/dispatch"
              f"{' (snapshot of the tree, on PYTHONPATH)' if args.snapshot else ''}")

        report_json = [hostrun, "--config", config, "report", "--json"]
        report_rich = [hostrun, "--config", config, "report"]
        report_per_call = [hostrun, "--config", per_call_config, "report", "--json"]
        subprocess.run(report_per_call, env=env, capture_output=True)  # caches that config too
        for i in range(2):  # validates + caches the config, sends the agent, starts the master
            t0 = time.perf_counter()
            proc = subprocess.run(report_json, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            print(f"warm-up {i + 1} (config cache{', agent upload, master start' if i == 0 else ''}): "
                  f"{wall * 1000:.1f} ms, exit {proc.returncode}")
            if proc.returncode != 0:
                print(f"hostrun report failed in the warm-up:\n{proc.stdout}\n{proc.stderr}",
                      file=sys.stderr)
                return 1
        if not (agent_file / "__main__.py").is_file():
            print(f"bench: the agent is not at {agent_file} after the warm-up", file=sys.stderr)
            return 1
        agent_mtime = agent_file.stat().st_mtime_ns
        agent_dir = peer.home / ".cache" / "hostrun"
        agents_before = sorted(p.name for p in agent_dir.glob("agent-*") if p.is_dir())
        daemons = peer.daemon_pids()
        print(f"daemon:       {'pid ' + str(daemons[0]) if daemons else 'NOT RUNNING'} "
              f"(sockets {', '.join(map(str, peer.daemon_sockets())) or 'none'})")
        if not daemons:
            print("bench: no report daemon on the peer after the warm-up", file=sys.stderr)
            return 1
        tree_before = sources_digest(REPO)
        for _ in range(3):  # fill the private bytecode cache
            subprocess.run(report_json, env=env_cached, capture_output=True)
        master_before = master_check(ssh_base)
        print(f"agent:        {agent_file} (unpacked, byte-compiled), present before timing")
        print(f"master:       {master_before or 'NOT RUNNING'}")

        # --- warm phase -------------------------------------------------------------------
        agent_cmd = remote_command(["sh", "-c", run_script, "hostrun-agent", agent_rel, "python3",
                                    "report", "--fallback", "{}"])
        warm = [
            Series("json", "hostrun report --json (local + peer1)", report_json, env, parse_json=True),
            Series("json_per_call", "report --json, agent_idle = 0 (per-call agent)", report_per_call,
                   env, parse_json=True),
            Series("rich", "hostrun report (rich; local + peer1)", report_rich, env),
            Series("ssh", "ssh peer1 true (warm master) [baseline]", [*ssh_base, PEER, "true"], env),
            Series("peer", "hostrun report --json --host peer1", [*report_json, "--host", PEER], env,
                   parse_json=True),
            Series("peer_per_call", "report --json --host peer1, agent_idle = 0",
                   [*report_per_call, "--host", PEER], env, parse_json=True),
            Series("local", "hostrun report --json --host local", [*report_json, "--host", "local"], env,
                   parse_json=True),
            Series("agent_ssh", "ssh peer1 <hostrun's agent command> (warm)",
                   [*ssh_base, "-T", PEER, "--", agent_cmd], env),
            Series("agent_direct", "python3 -I <agent dir> report (here, no ssh)",
                   [peer_python, "-I", str(agent_file), "report", "--fallback", "{}"], peer_env),
            Series("py_ssh", "ssh peer1 python3 -I -c pass (warm)",
                   [*ssh_base, "-T", PEER, "python3", "-I", "-c", "pass"], env),
            Series("py", "python -c pass (hostrun's interpreter)", [python, "-c", "pass"], env),
            Series("py_asyncio", "python -c 'import asyncio'", [python, "-c", "import asyncio"], env),
        ]
        if not args.no_cached_series:
            warm.insert(1, Series("json_cached", "hostrun report --json, .pyc cached [*]", report_json,
                                  env_cached, parse_json=True))
        run_phase(warm, args.runs)
        master_after = master_check(ssh_base)
        med = print_table(f"WARM: {args.runs} runs each, interleaved, ControlMaster up", warm)
        target_key = args.target_on
        ok = True
        warm_ratio = med[target_key] / med["ssh"]
        print(f"\n  ratio of medians, report --json / ssh true: {med['json'] / med['ssh']:.2f}x; "
              f"report (rich) / ssh true: {med['rich'] / med['ssh']:.2f}x; "
              f"rich rendering costs {(med['rich'] - med['json']) * 1000:.1f} ms over --json")
        print(f"  before/after: per-call agent (agent_idle = 0) {med['json_per_call'] * 1000:.1f} ms = "
              f"{med['json_per_call'] / med['ssh']:.2f}x; report daemon {med['json'] * 1000:.1f} ms = "
              f"{med['json'] / med['ssh']:.2f}x (peer only: {med['peer_per_call'] * 1000:.1f} -> "
              f"{med['peer'] * 1000:.1f} ms)")
        print(f"  where the report's time goes (medians): local-only report {med['local'] * 1000:.1f} ms, "
              f"peer-only report {med['peer'] * 1000:.1f} ms; the agent command over ssh "
              f"{med['agent_ssh'] * 1000:.1f} ms (= ssh true + "
              f"{(med['agent_ssh'] - med['ssh']) * 1000:.1f} ms on the peer), the agent alone "
              f"{med['agent_direct'] * 1000:.1f} ms")
        floor = med["py"] + med["py_ssh"]
        print(f"  floor of any Python controller + Python agent (python -c pass + ssh python3 -I -c pass): "
              f"{floor * 1000:.1f} ms = {floor / med['ssh']:.2f}x ssh true")
        print(f"  import asyncio alone (for reference; the report path no longer imports it): "
              f"{(med['py_asyncio'] - med['py']) * 1000:.1f} ms over python -c pass")
        if "json_cached" in med:
            print(f"  [*] with dispatch's bytecode cached: {med['json_cached'] / med['ssh']:.2f}x "
                  f"({(med['json'] - med['json_cached']) * 1000:.1f} ms less than as is)")
        verdict = "PASS" if warm_ratio <= WARM_TARGET else "FAIL"
        ok &= verdict == "PASS"
        print(f"  target (on report{' --json' if target_key == 'json' else ''}): "
              f"{warm_ratio:.2f}x <= {WARM_TARGET:.0f}x -> {verdict}")
        if master_before != master_after or not master_after:
            print(f"  WARNING: the master changed during the warm phase: {master_before!r} -> "
                  f"{master_after!r}")
            ok = False

        # --- cold phase -------------------------------------------------------------------
        def cold() -> None:
            stop_master(ssh_base, ctl_dir)

        cold_series = [
            Series("json", "hostrun report --json (local + peer1), no master", report_json, env,
                   before=cold, parse_json=True),
            Series("rich", "hostrun report (rich), no master", report_rich, env, before=cold),
            Series("json_per_call", "report --json, agent_idle = 0, no master", report_per_call, env,
                   before=cold, parse_json=True),
            Series("ssh", "ssh -o ControlMaster=no -o ControlPath=none peer1 true",
                   ["ssh", "-F", ssh_cfg, "-o", "ControlMaster=no", "-o", "ControlPath=none", PEER,
                    "true"], env, before=cold),
        ]
        run_phase(cold_series, args.runs)
        stop_master(ssh_base, ctl_dir)
        cmed = print_table(f"COLD: {args.runs} runs each, interleaved, master stopped before every run",
                           cold_series)
        cold_ratio = cmed[target_key] / cmed["ssh"]
        print(f"\n  before/after, cold: per-call agent {cmed['json_per_call'] / cmed['ssh']:.2f}x, report "
              f"daemon {cmed['json'] / cmed['ssh']:.2f}x (its socket forwarded again, the daemon still up)")
        print(f"\n  ratio of medians, report --json / cold ssh true: {cmed['json'] / cmed['ssh']:.2f}x; "
              f"report (rich) / cold ssh true: {cmed['rich'] / cmed['ssh']:.2f}x")
        verdict = "PASS" if cold_ratio <= COLD_TARGET else "FAIL"
        ok &= verdict == "PASS"
        print(f"  target (on report{' --json' if target_key == 'json' else ''}): "
              f"{cold_ratio:.2f}x <= {COLD_TARGET}x -> {verdict}")

        failures = [f for s in warm + cold_series for f in s.failures]
        if failures:
            ok = False
            print(f"\n  {len(failures)} run(s) failed:")
            for line in failures[:10]:
                print(f"    {line}")
        agents = sorted(p.name for p in agent_dir.glob("agent-*") if p.is_dir())
        resent = agent_file.stat().st_mtime_ns != agent_mtime or agents != agents_before
        print(f"\n  agent on the peer: {', '.join(agents)}; sent during timing: "
              f"{'YES (an upload was timed)' if resent else 'no'}")
        ok &= not resent
        if sources_digest(REPO) != tree_before:
            if args.snapshot:
                print("  (dispatch/*.py changed in the tree while the bench ran; the runs used the "
                      "snapshot taken at the start, so they all measured the same code)")
            else:
                print("  WARNING: dispatch/*.py changed while the bench ran: the runs measured different "
                      "code (and a new agent was sent); rerun on a quiet tree or with --snapshot")
                ok = False

        importtime_profile(python, ["-m", "dispatch", "--config", config, "report", "--json"],
                           "`report --json`", env, args.top)
        importtime_profile(python, ["-m", "dispatch", "--config", config, "report"],
                           "`report` (rich)", env, 0)
        importtime_profile(python, ["-c", REPORT_PATH_MODULES],
                           "the report path's modules imported in one thread", env, args.top)

        left = ledger_leftovers(state_dir, "local") + ledger_leftovers(str(peer.state_dir), PEER)
        left += stop_daemons(peer)
        left += cgroup_leftovers(slice_dir, "local") + cgroup_leftovers(peer_slice_dir, PEER)
        print("\nleftovers after all runs: " + ("none" if not left else ""))
        for line in left:
            print(f"  {line}")
        print(f"\nresult: {'PASS' if ok and not left else 'FAIL'}")
        return 0 if ok and not left else 1
    finally:
        if ssh_base:
            stop_master(ssh_base, ctl_dir, kill=True)
        if peer is not None:
            peer.stop()
        remove_slice(slice_dir)
        remove_slice(peer_slice_dir)
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
