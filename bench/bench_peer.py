#!/usr/bin/env python3
"""``hostrun --peer -- true`` on a ~20,000-file, ~300 MB tree against the same work done by hand
(rsync over the same warm ControlMaster, then ``ssh peer 'cd DIR && true'``), measured in the same run.

What is measured
----------------
A tree is generated under /tmp (seeded: the same tree every run): ~16,800 small source-like files
(0.3-9 KB) in ~800 nested directories, 200 larger binary files (~240 MiB in all), a ``.gitignore``
ignoring ``target/`` and ``*.log``, and a ``target/`` with 3,000 build-output-like files (plus a few
``*.log``): ~20,000 files, ~300 MB. It is a git repository with one commit (it has an index, as a real
checkout does). One real OpenSSH peer is started with ``tests/support/sshd.py``'s ``SshdPeer`` on a loopback
address (127.0.0.2 by default): its own sshd, keys, hostrun config, state dir, slice cgroup and home
(the work root is ``<peer home>/hostrun-work``). The controller's private config enables peers and
sets ``toolchain_probes = ["rsync --version"]``, as the tests do; hostrun runs from inside the tree.

Warm-up (not timed): ``hostrun --peer -- true`` twice (config validation, agent upload, ControlMaster
start, the full first sync; then, its sync record removed so that it rsyncs in full rather than skip
the rsync, the same again), the second time with ``ssh``/``rsync`` wrappers
first on its PATH that record the exact argv of every ssh and rsync it starts; then one by-hand run.
hostrun's flow, which the recorded calls must show: ONE ssh session running the agent
(``agent run``, its spec the first frame on stdin; the agent probes the toolchain and prepares the
work directory, sends a ``P`` frame, waits while hostrun compares and rsyncs, heartbeating, then gets
``G`` and runs the job in the same session), ONE rsync (the sync, with its own ssh transport under
it), and possibly the local toolchain probe itself (``rsync --version``: recorded by the rsync wrapper
too, told apart by having no ``-e``; it runs only when hostrun's cached probe output is stale).

The by-hand side is built from what hostrun really ran: the rsync is hostrun's own rsync argv
(issue 4's ``-a --delete --modify-window=-1 --filter=':- .gitignore' --exclude=/.git/`` plus whatever
hostrun adds, printed; its ``-e`` is checked against ``PeerClient(...).ssh.rsync_rsh()``), to a
copy of its own beside hostrun's (``<hostrun's remote dir>-byhand``: an rsync into hostrun's copy
would be a change there that hostrun's next run must repair with a full rsync); the ssh is
hostrun's own session argv (same options, same master) with ``cd DIR && true`` as the command.

Targets, four series interleaved (the order rotates every round, so all share the machine's noise),
``--runs`` (>= 10, default 15) each:

1. no change:   ``hostrun --config C --peer -- true``  vs  by hand (rsync, then ssh 'cd DIR && true')
2. 10 touched:  the same two, but before EACH measured run (untimed) 10 random small tracked files are
                rewritten with new content; after it, the peer's copies of those 10 are compared with
                ours (a stale copy is a failure).

Target: ratio of medians <= 1.1x in both cases (issue 4); stretch goal < 1.0x (reported only).

Where the time goes (for the next engineer; printed after the targets):

* PARTS, interleaved, medians: ``ssh peer1 true`` and ``ssh peer1 'cd DIR && true'`` through the master;
  rsync alone; the peer's python start over ssh and alone; hostrun's session replayed exactly as
  recorded but without the rsync in it (this bench drives the frames: it answers the agent's ``P`` with
  ``G`` at once, keeps stdin open as hostrun does; split into "to the P frame" and "from G to the
  end"); the agent's probe alone over ssh (``ssh peer1 python3 -I <agent dir> probe --spec <hostrun's
  prepare spec>``); on this machine with the peer's environment (no ssh): the same session, the agent's
  ``probe`` command, its run path alone (hostrun's spec without ``prepare``: no P, no wait) and the
  probe on a copy of the agent without its ``__pycache__`` (``[src]``: what shipping it byte-compiled
  saves); a local ``hostrun -- true`` (the same ``run_local``); ``hostrun --peer`` with its bytecode
  cached (``[*]``: a private ``PYTHONPYCACHEPREFIX``); ``git rev-parse``; and for the stretch goal, what
  a fingerprint could cost instead of rsync's walk: ``git status --porcelain``, a Python ``os.scandir``
  stat walk, and an rsync of only the touched files (``--files-from``).
* LOCAL STEPS: hostrun's local imports, config load, agent naming and toolchain probe (cached), timed
  in-process.
* SYNC CHECK: the steps that decide whether to rsync, timed in-process after the series (nothing
  changed): here the record's load, the tree's walk reusing its listings, the compare, and a walk
  without listings; on the peer (its python, the shipped agent, no ssh) the manifest's load, the
  copy's walk reusing its listings, the compare, a walk without listings, and ``check_copy`` whole.
* TIMELINE of ``hostrun --peer -- true`` (median of ``--timeline-runs`` runs): ``strace -f -ttt
  --seccomp-bpf -e trace=execve,write -e raw=write`` on the local side (when git, the ssh and rsync
  started and ended, and when hostrun wrote its ``G`` frame: its main thread's first 5-byte write after
  rsync's exit) and,
  on the peer, a bash wrapper set as the peer's ``python`` in a second config, which stamps the agent's
  start with ``$EPOCHREALTIME`` and ``exec``s python3. The one session is cut at those points: local
  start-up, git, local glue, ssh set-up (to the agent's start), the agent's start and probe until its
  ``P`` frame plus hostrun's compare (to rsync's exec), rsync, rsync's exit until hostrun sends ``G``,
  the run after ``G`` (to the session's end), local to exit. With no rsync (nothing changed), ``G``
  is the main thread's first 5-byte write after the agent's start, and the agent's start, probe and
  copy check plus hostrun's compare are one segment.
* Import-time profiles of the local side and of the agent, then a summary: the sync check on each
  side, and what the rest of a run costs without the peer's check.

Isolation: a private temporary directory holds the tree, the controller's config (own ``state_dir``,
slice cgroup ``<this process's memory cgroup>/hostrun-bench-<pid>``, own ``XDG_CACHE_HOME``) and the
peer (slice cgroup ``<this process's memory cgroup>/hostrun-bench-peer1-<pid>``). In a ``finally`` block:
the ControlMaster is stopped (``ssh -O exit``, then any process whose command line still names this
run's control directory is killed by pid), sshd and everything below it is stopped, both slice cgroups
and the directory (tree, peer copy) are removed. Bookings, job cgroups or processes left behind are
reported first, as a failure; so are an agent re-sent during timing, a changed master, a replayed
session that failed and a peer copy that differs from the tree at the end (``rsync --dry-run``).

Needs root, ``/usr/sbin/sshd`` (openssh-server), ``ssh``, ``rsync``, ``git``, ``bash``, a memory-cap
backend (cgroup v1 on the reference machines), ~700 MB free under /tmp, and ``strace`` for the timeline
(skipped without it). Standard library only, plus the repository's ``tests/support/sshd.py``; what comes from
hostrun's code is read through a subprocess running hostrun's interpreter. Run by hand::

    .venv/bin/python bench/bench_peer.py            # --runs 15 --timeline-runs 5 --snapshot --keep
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import select
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
)

from tests.support.sshd import SshdPeer  # noqa: E402  (a real sshd peer, as in the tests)

TARGET_RATIO = 1.1
STRETCH_RATIO = 1.0
MEMORY_MOUNT = "/sys/fs/cgroup/memory"
PEER = "peer1"
TOUCHED = 10
SYNC_FLAGS = ["-a", "--delete", "--modify-window=-1", "--filter=:- .gitignore", "--exclude=/.git/"]

# Run with hostrun's interpreter and environment: everything the by-hand side must copy from hostrun.
INTROSPECT = r"""
import json, sys
import dispatch
from dispatch.hosts.ssh import bundle as agent
from dispatch.config import load_settings
from dispatch.hosts.ssh.peer import _RUN, PeerClient
settings = load_settings(sys.argv[1])
host = settings.hosts[sys.argv[2]]
client = PeerClient(settings, host)
print(json.dumps({"rsh": client.ssh.rsync_rsh(), "base": client.ssh.base_argv(),
                  "dest": client.ssh.destination, "ctl_dir": client.ssh.ctl_dir,
                  "agent": agent.remote_path(), "run": _RUN, "python": client.python,
                  "probes": list(settings.toolchain_probes), "code": dispatch.__file__}))
"""

# The spec hostrun's session sends first on its stdin (a J frame), for `hostrun --peer -- true` run
# from the tree (argv[3]); printed base64-encoded.
SPEC_OF = r"""
import base64, os, sys
from dispatch.config import load_settings
from dispatch.hosts.ssh.peerrun import PeerRun
from dispatch.core.request import RunRequest
settings = load_settings(sys.argv[1])
os.chdir(sys.argv[3])
run = PeerRun(settings, settings.hosts[sys.argv[2]], RunRequest(argv=["true"]), print)
print(base64.b64encode(run.spec()).decode())
"""

# A stat walk of the tree (.git and the top-level target/ skipped): what a "cheap fingerprint" that
# lets hostrun skip the rsync walk would cost at least.
WALK = r"""
import hashlib, os, sys, time
t0 = time.perf_counter()
root = sys.argv[1]
h = hashlib.blake2b(digest_size=16)
n = 0
stack = [root]
while stack:
    d = stack.pop()
    with os.scandir(d) as it:
        for e in it:
            if d == root and e.name in (".git", "target"):
                continue
            st = e.stat(follow_symlinks=False)
            h.update(f"{e.path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
            n += 1
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
print(n, h.hexdigest(), f"{(time.perf_counter() - t0) * 1000:.1f}")
"""

# The sync check's steps, timed in-process (ms): here with hostrun's interpreter (the record of the
# last sync, the tree's walk reusing its listings, the compare, and a walk without them), on the peer
# with its python and the shipped agent (the manifest, the copy's walk, the compare; check_copy whole).
SYNC_HERE = r"""
import glob, json, os, sys, time
from dispatch.agent.treestate import walk
from dispatch.hosts.ssh import syncstate
(record,) = glob.glob(os.path.join(sys.argv[1], "peer-sync", "*"))
out = []
def timed(label, fn):
    t = time.perf_counter(); value = fn(); out.append((label, (time.perf_counter() - t) * 1000))
    return value
loaded = timed("here: load the record of the last sync", lambda: syncstate.load(record))
walked = timed("here: walk the tree, reusing the record's listings",
               lambda: walk(sys.argv[2], [], loaded[1] if loaded else None))
same = timed("here: compare with the record", lambda: bool(loaded and walked and walked.same_as(loaded[1])))
timed("here: walk the tree without listings (first run, or none valid)", lambda: walk(sys.argv[2], []))
out.append(("here: unchanged (1 = yes)", float(same)))
print(json.dumps(out))
"""
SYNC_PEER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from dispatch.agent.treestate import MANIFEST, check_copy, loads, read_private, walk
copy = sys.argv[2]
out = []
def timed(label, fn):
    t = time.perf_counter(); value = fn(); out.append((label, (time.perf_counter() - t) * 1000))
    return value
loaded = timed("peer: read the copy's manifest", lambda: loads(read_private(os.path.join(copy, MANIFEST))))
walked = timed("peer: walk the copy, reusing the manifest's listings",
               lambda: walk(copy, [], loaded[1] if loaded else None))
timed("peer: compare with the manifest", lambda: bool(loaded and walked and walked.same_as(loaded[1])))
timed("peer: walk the copy without listings", lambda: walk(copy, []))
result = timed("peer: check_copy, whole (what the agent does before its P frame)",
               lambda: check_copy(copy, [])[0])
out.append(("peer: copy clean (1 = yes)", float(bool(result.get("clean")))))
print(json.dumps(out))
"""

RUN_PATH_MODULES = ("import dispatch.agent.main, dispatch.agent.run, dispatch.local.run.runner, "
                    "dispatch.local.admission.ledger, dispatch.guards.toolchain")

# Run with hostrun's interpreter: the local steps of `hostrun --peer`, timed in-process.
INPROC = r"""
import json, sys, time
out = []
def step(label, fn):
    t = time.perf_counter()
    try:
        fn()
    except Exception as exc:
        out.append([f"{label} (failed: {type(exc).__name__})", None])
        return
    out.append([label, (time.perf_counter() - t) * 1000])
step("import dispatch.cli.main", lambda: __import__("dispatch.cli.main"))
step("then import dispatch.hosts.ssh.peerrun (what --peer adds)",
     lambda: __import__("dispatch.hosts.ssh.peerrun"))
loaded = []
def settings():
    from dispatch.config import load_settings
    loaded.append(load_settings(sys.argv[1]))
step("load_settings(config) (from its marshal cache)", settings)
def name():
    from dispatch.hosts.ssh import bundle as agent
    agent.remote_path()
step("agent.remote_path(): reads + hashes the core sources (every run)", name)
def probe():
    from dispatch.guards.toolchain import probe_here
    probe_here(list(loaded[0].toolchain_probes), loaded[0].state_dir)
step("toolchain probe_here(probes) here (its cached output)", probe)
print(json.dumps(out))
"""


# ---------------------------------------------------------------- shared setup helpers














def pct(values: list[float], q: int) -> float:
    """q-th percentile (inclusive method), q in 1..99."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]




def agents_in(directory: Path) -> list[str]:
    """The agents sent to the peer (``agent-*`` directories), not their temporaries (``.tmp.``)."""
    return sorted(p.name for p in directory.glob("agent-*") if ".tmp" not in p.name)


# ---------------------------------------------------------------- ssh master handling
def pids_with(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (this run's private control dir). A master
    renames itself ``ssh: DIR/HASH [mux]``; its clients carry ``ControlPath=DIR/%C``: ``DIR/`` matches
    both."""
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


def master_check(base: list[str], dest: str) -> str:
    proc = subprocess.run([*base, "-O", "check", dest], capture_output=True, text=True, timeout=10)
    return (proc.stderr.strip() or proc.stdout.strip()) if proc.returncode == 0 else ""


def stop_master(base: list[str], dest: str, ctl_dir: str) -> None:
    """``ssh -O exit``; then kill, by pid, whatever still names this run's control directory."""
    if base:
        subprocess.run([*base, "-O", "exit", dest], capture_output=True, timeout=10, check=False)
    marker = ctl_dir.rstrip("/") + "/"
    deadline = time.monotonic() + 2.0
    while pids_with(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    for pid in pids_with(marker):
        print(f"bench: warning: ssh process {pid} still up after -O exit; killing it", file=sys.stderr)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- the tree
WORDS = ("let mut fn impl struct enum match self return pub use mod crate super where async await "
         "Result Option Some None Ok Err Vec String usize u64 i32 bool true false config state "
         "buffer index value count path node edge graph cache reader writer handle error parse "
         "build target source module item entry field range slice token frame batch worker").split()


def source_lines(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        indent = "    " * rng.randint(0, 3)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
        tail = rng.choice((";", " {", "}", ",", "", ")", " // " + rng.choice(WORDS)))
        lines.append(f"{indent}{words}{tail}\n")
    return lines


def source_text(rng: random.Random, lines: list[str], tag: str) -> bytes:
    size = int(rng.lognormvariate(7.7, 0.6))  # median ~2.2 KB, mean ~2.7 KB
    size = max(300, min(size, 9000))
    out = [f"// {tag}\n"]
    total = len(out[0])
    while total < size:
        line = rng.choice(lines)
        out.append(line)
        total += len(line)
    return "".join(out).encode()


class Tree:
    def __init__(self, root: str, small: list[str], counts: dict[str, tuple[int, int]]) -> None:
        self.root = root
        self.small = small  # tracked small files, relative paths
        self.counts = counts  # kind -> (files, bytes)


def make_tree(root: str, seed: int, small_n: int, large_n: int, large_mb: int, target_n: int) -> Tree:
    rng = random.Random(seed)
    lines = source_lines(rng, 4000)
    os.makedirs(root)
    counts = {"small": [0, 0], "large": [0, 0], "ignored": [0, 0]}

    def write(rel: str, data: bytes, kind: str) -> None:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        counts[kind][0] += 1
        counts[kind][1] += len(data)

    write(".gitignore", b"target/\n*.log\n", "small")
    small: list[str] = []
    groups = (("crates", ".rs", 0.55), ("python", ".py", 0.2), ("web/src", ".ts", 0.15),
              ("docs", ".md", 0.06), ("config", ".toml", 0.04))
    for top, ext, share in groups:
        n = int(small_n * share)
        per_dir = 21
        for i in range(n):
            d = i // per_dir
            # nested: top/aNN/bNN[/cNN]
            parts = [top, f"a{d // 40:02d}", f"b{d % 40:02d}"]
            if d % 3 == 0:
                parts.append(f"c{d % 7}")
            rel = "/".join([*parts, f"f{i % per_dir:02d}_{rng.choice(WORDS)}{ext}"])
            write(rel, source_text(rng, lines, rel), "small")
            small.append(rel)
    sizes = [rng.uniform(0.2, 1.8) for _ in range(large_n)]
    scale = large_mb * (1 << 20) / sum(sizes)
    for i, s in enumerate(sizes):
        sub = ("assets/textures", "assets/models", "data/fixtures", "vendor/blobs")[i % 4]
        write(f"{sub}/blob_{i:03d}.bin", rng.randbytes(int(s * scale)), "large")
    for i in range(target_n):
        sub = ("debug/deps", "debug/build", "debug/incremental", "release/deps")[i % 4]
        write(f"target/{sub}/{i // 250:02d}/obj_{i:04d}.o", rng.randbytes(rng.randint(1000, 7000)),
              "ignored")
    for i in range(5):
        write(f"build-{i}.log", b"ignored log line\n" * 200, "ignored")
    git = ["git", "-C", root, "-c", "gc.auto=0", "-c", "core.looseCompression=1",
           "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "generated tree"], check=True)
    return Tree(root, small, {k: (v[0], v[1]) for k, v in counts.items()})


def touch_files(tree: Tree, rng: random.Random, lines: list[str], n: int) -> list[str]:
    """Rewrite ``n`` random small tracked files with new content; returns their relative paths."""
    chosen = rng.sample(tree.small, n)
    for rel in chosen:
        data = source_text(rng, lines, f"{rel} rewritten {time.time_ns()}")
        with open(os.path.join(tree.root, rel), "wb") as fh:
            fh.write(data)
    return chosen


# ---------------------------------------------------------------- series
class Series:
    def __init__(self, key: str, label: str, steps: list[list[str]], env: dict[str, str], cwd: str,
                 before: Callable[[], object] | None = None,
                 after: Callable[[object], str | None] | None = None) -> None:
        self.key, self.label, self.steps, self.env, self.cwd = key, label, steps, env, cwd
        self.before = before  # run (untimed) before every timed run; its value goes to ``after``
        self.after = after  # untimed check after every run; returns a failure or None
        self.times: list[float] = []
        self.splits: dict[str, list[float]] = {}  # sub-times of one run (FramedSeries), by label
        self.failures: list[str] = []
        self.last_stdout = b""

    def run_once(self, i: int) -> None:
        token = self.before() if self.before is not None else None
        t0 = time.perf_counter()
        for argv in self.steps:  # one after the other, as by hand; stop at the first failure
            proc = subprocess.run(argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                  capture_output=True)
            if proc.returncode != 0:
                break
        self.times.append(time.perf_counter() - t0)
        self.last_stdout = proc.stdout
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()[-300:]
            self.failures.append(f"run {i} {self.key}: {os.path.basename(argv[0])} exit "
                                 f"{proc.returncode}: {err}")
            return
        if self.after is not None:
            problem = self.after(token)
            if problem:
                self.failures.append(f"run {i} {self.key}: {problem}")


# ---------------------------------------------------------------- driving an agent session's frames
FRAME = struct.Struct(">cI")  # dispatch.agent.frames: one type byte, a 4-byte big-endian length, the payload
TO_P, AFTER_G = "to the P frame", "from G to the end"


def drive_session(argv: list[str], env: dict[str, str], cwd: str, spec: bytes, timeout: float = 120.0
                  ) -> tuple[float | None, float, int, dict[str, Any] | None, dict[str, Any] | None, str]:
    """Run an agent ``run`` session (over ssh or directly) as hostrun does, minus the rsync: stdin a
    pipe of control frames kept open until the end, the spec (a ``J`` frame) first; the agent's ``P``
    frame is answered with ``G`` at once. Returns (seconds to the P frame or None, total seconds, exit
    status, the P payload, the R payload, stderr's tail)."""
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(FRAME.pack(b"J", len(spec)) + spec)
    proc.stdin.flush()
    deadline = t0 + timeout
    to_p: float | None = None
    prepared = result = None
    buf = b""
    try:
        while True:
            # not a blocking read: through a ControlMaster the master holds ssh's stdout open
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.perf_counter()))
            if not ready:
                proc.kill()
                err.write(f"\nbench: no end within {timeout:g} s; killed".encode())
                break
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            buf += data
            while len(buf) >= FRAME.size:
                kind, size = FRAME.unpack_from(buf)
                if len(buf) < FRAME.size + size:
                    break
                payload, buf = buf[FRAME.size:FRAME.size + size], buf[FRAME.size + size:]
                if kind == b"P" and to_p is None:
                    to_p = time.perf_counter() - t0
                    proc.stdin.write(FRAME.pack(b"G", 0))
                    proc.stdin.flush()
                    prepared = json.loads(payload)
                elif kind == b"R":
                    result = json.loads(payload)
    finally:
        proc.stdin.close()
        proc.stdout.close()
        returncode = proc.wait()
        total = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace").strip()[-300:]
        err.close()
    return to_p, total, returncode, prepared, result, stderr


class FramedSeries(Series):
    """One agent session per run, driven by ``drive_session``; with ``prepare`` in the spec the time
    is also split at the P frame."""

    def __init__(self, key: str, label: str, argv: list[str], env: dict[str, str], cwd: str,
                 spec: bytes, expect_p: bool = True) -> None:
        super().__init__(key, label, [argv], env, cwd)
        self.spec = spec
        self.expect_p = expect_p

    def run_once(self, i: int) -> None:
        to_p, total, returncode, prepared, result, stderr = drive_session(self.steps[0], self.env,
                                                                          self.cwd, self.spec)
        self.times.append(total)
        problem = None
        if returncode != 0:
            problem = f"exit {returncode}: {stderr}"
        elif result is None:
            problem = f"no R frame: {stderr}"
        elif result.get("exit_code") != 0:
            problem = f"the job's result: {json.dumps(result)[:300]}"
        elif self.expect_p and (to_p is None or not prepared or "workdir" not in prepared):
            problem = f"no P frame with a work directory: {prepared}"
        if problem:
            self.failures.append(f"run {i} {self.key}: {problem}")
        if self.expect_p and to_p is not None:
            self.splits.setdefault(TO_P, []).append(to_p)
            self.splits.setdefault(AFTER_G, []).append(total - to_p)


def run_phase(series: list[Series], runs: int) -> None:
    for i in range(runs):
        k = i % len(series)
        for s in series[k:] + series[:k]:  # rotate: share the noise
            s.run_once(i)


def print_table(title: str, series: list[Series]) -> dict[str, float]:
    print(f"\n{title}; wall time in ms")
    print(f"  {'':58} {'median':>8} {'p10':>8} {'p90':>8} {'min':>8} {'max':>8}")
    med = {}
    for s in series:
        rows = [(s.key, s.label, s.times)]
        rows += [(f"{s.key}:{name}", f"    {name}", v) for name, v in s.splits.items() if len(v) >= 2]
        for key, label, v in rows:
            med[key] = statistics.median(v)
            print(f"  {label:58} {med[key] * 1000:8.1f} {pct(v, 10) * 1000:8.1f} "
                  f"{pct(v, 90) * 1000:8.1f} {min(v) * 1000:8.1f} {max(v) * 1000:8.1f}")
    return med


# ---------------------------------------------------------------- capturing hostrun's own commands
CAPTURE = """#!/bin/bash
printf '%s\\0' "$@" > {log}/"$EPOCHREALTIME-{name}-$$"
exec {real} "$@"
"""


def capture_bin(directory: str, log: str) -> None:
    """``ssh`` and ``rsync`` wrappers that log their argv (NUL-separated, one file per call) and exec
    the real ones: put ``directory`` first on hostrun's PATH to see exactly what it runs."""
    os.makedirs(directory)
    os.makedirs(log)
    for name in ("ssh", "rsync"):
        real = shutil.which(name)
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(CAPTURE.format(log=shlex.quote(log), name=name, real=shlex.quote(str(real))))
        os.chmod(path, 0o755)


def captured(log: str) -> list[tuple[str, list[str]]]:
    """[(program, argv without argv[0])] in the order they were started."""
    calls = []
    for entry in sorted(os.listdir(log), key=lambda e: float(e.split("-", 1)[0])):
        with open(os.path.join(log, entry), "rb") as fh:
            words = fh.read().decode("utf-8", "surrogateescape").split("\0")[:-1]
        calls.append((entry.split("-")[1], words))
    return calls


def agent_call(remote: str) -> tuple[str, str, list[str]] | None:
    """(agent path, python, agent argv) of an ssh remote command that runs the agent, else None."""
    try:
        words = shlex.split(remote)
    except ValueError:
        return None
    if "hostrun-agent" not in words:
        return None
    i = words.index("hostrun-agent")
    return words[i + 1], words[i + 2], words[i + 3:]


# ---------------------------------------------------------------- timeline (strace + peer stamps)
EXEC_RE = re.compile(r"^(\d+)\s+([\d.]+)\s+(execve\(.*)$")
EXIT_RE = re.compile(r"^(\d+)\s+([\d.]+)\s+\+\+\+ (?:exited with|killed by)")
RESUMED_RE = re.compile(r"^(\d+)\s+([\d.]+)\s+<\.\.\. execve resumed>.*= 0")
PROG_RE = re.compile(r'execve\("([^"]*)"')
# write(2) traced raw (no data decoded): a 5-byte write is an empty control frame (G, H, X)
WRITE5_RE = re.compile(r"^(\d+)\s+([\d.]+)\s+write\(0x[0-9a-f]+, 0x[0-9a-f]+, 0x5(?:\)|\s*<unfinished)")


def parse_strace(path: str) -> tuple[list[tuple[float, int, str]], dict[int, float],
                                     list[tuple[float, int]]]:
    """([(time, pid, the execve line)] of successful execs, {pid: exit time}, [(time, pid)] of
    5-byte writes)."""
    execs: list[tuple[float, int, str]] = []
    pending: dict[int, tuple[float, str]] = {}
    exits: dict[int, float] = {}
    writes: list[tuple[float, int]] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = WRITE5_RE.match(line)
            if m:
                writes.append((float(m.group(2)), int(m.group(1))))
                continue
            m = EXEC_RE.match(line)
            if m:
                pid, ts, text = int(m.group(1)), float(m.group(2)), m.group(3)
                if line.rstrip().endswith("= 0"):
                    execs.append((ts, pid, text))
                elif "<unfinished" in line:
                    pending[pid] = (ts, text)
                continue
            m = RESUMED_RE.match(line)
            if m and int(m.group(1)) in pending:
                ts, text = pending.pop(int(m.group(1)))
                execs.append((ts, int(m.group(1)), text))
                continue
            m = EXIT_RE.match(line)
            if m:
                exits[int(m.group(1))] = float(m.group(2))
    return execs, exits, writes


# (from point, to point) -> the segment's label in the timeline (and in its summary line)
SEG_START = "local start-up: interpreter, imports, config, ..."
SEG_GIT = "git rev-parse --show-toplevel"
SEG_GLUE = "local, before the session: tree id, spec, agent name"
SEG_SSH = "ssh via the master + shell, to the agent's start"
SEG_TO_P = "the agent: start, imports, probe -> P frame; here: compare"
SEG_RSYNC = "rsync (walk both sides; sends only what changed)"
SEG_WAIT_G = "here: from rsync's exit until G is sent"
SEG_AFTER_G = "after G: the agent runs true (booking, cgroup, peak), R, ends"
SEG_EXIT = "local, after the session, to exit"
SEG_TO_G = "no rsync: the agent's start, imports, probe, copy check -> P; here: walk, compare -> G"
SEGMENTS = {
    ("exec", "git"): SEG_START, ("git", "git end"): SEG_GIT, ("git end", "ssh"): SEG_GLUE,
    ("ssh", "agent"): SEG_SSH, ("agent", "rsync"): SEG_TO_P, ("rsync", "rsync end"): SEG_RSYNC,
    ("rsync end", "G"): SEG_WAIT_G, ("G", "ssh end"): SEG_AFTER_G, ("ssh end", "exit"): SEG_EXIT,
    ("rsync end", "ssh end"): "after rsync: G (not seen), the run, R, the session ends",
    ("agent", "probe"): SEG_TO_P, ("probe", "probe end"): "local toolchain probe (rsync --version)",
    ("probe end", "rsync"): "here: compare, start rsync",
    ("ssh", "rsync"): "the session to rsync's start (no peer stamp)",
    ("agent", "G"): SEG_TO_G,
}


def timeline_once(argv: list[str], env: dict[str, str], cwd: str, trace: str, stamps: str
                  ) -> tuple[list[tuple[str, float]], float, float, str]:
    """One straced run: ([(segment, seconds)] in order, total, wall, problem)."""
    if os.path.exists(stamps):
        os.unlink(stamps)
    t0 = time.perf_counter()
    # write(2) too, raw (not decoded: rsync's writes stay cheap): hostrun's G frame is its main
    # thread's first 5-byte write after rsync's exit
    proc = subprocess.run(["strace", "-f", "-ttt", "-s", "65536", "--seccomp-bpf", "-e", "trace=execve,write",
                           "-e", "raw=write", "-e", "signal=none", "-o", trace, *argv], env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return [], 0.0, wall, f"exit {proc.returncode}: {proc.stderr.decode('utf-8', 'replace')[-300:]}"
    execs, exits, writes = parse_strace(trace)
    peer: list[tuple[float, str]] = []
    if os.path.exists(stamps):
        with open(stamps, encoding="utf-8") as fh:
            for line in fh:
                stamp, _, command = line.strip().partition(" ")
                peer.append((float(stamp), command))
    if not execs:
        return [], 0.0, wall, "no execve in the trace"
    start, root = execs[0][0], execs[0][1]
    end = exits.get(root, start)
    # Points in time; the segments lie between consecutive points. The session's ssh spans the agent's
    # start, the P frame, hostrun's compare, rsync and the run after G: rsync's exec and exit cut it.
    points: list[tuple[float, str]] = [(start, "exec"), (end, "exit")]
    rsync_spans: list[tuple[float, float]] = []
    for ts, pid, text in execs[1:]:
        m = PROG_RE.match(text)
        prog = os.path.basename(m.group(1)) if m else "?"
        stop = exits.get(pid, ts)
        if any(a <= ts <= b for a, b in rsync_spans):
            continue  # rsync's own ssh
        if prog == "rsync" and '"-e"' in text:
            points += [(ts, "rsync"), (stop, "rsync end")]
            rsync_spans.append((ts, stop))
            go = [t for t, pid in writes if pid == root and t >= stop]
            if go:
                points.append((go[0], "G"))
        elif prog == "rsync":
            points += [(ts, "probe"), (stop, "probe end")]  # the local toolchain probe, uncached
        elif prog == "ssh" and "hostrun-agent" in text:
            points += [(ts, "ssh"), (stop, "ssh end")]
            if peer:
                points.append((peer.pop(0)[0], "agent"))
        elif prog == "git":
            points += [(ts, "git"), (stop, "git end")]
        else:
            points += [(ts, f"exec {prog}"), (stop, f"{prog} end")]
    agent_at = [t for t, name in points if name == "agent"]
    if not rsync_spans and agent_at:  # rsync skipped: G is the main thread's first empty frame
        go = [t for t, pid in writes if pid == root and t >= agent_at[0]]
        if go:
            points.append((go[0], "G"))
    points.sort()
    segments = [(SEGMENTS.get((a, b), f"other: {a} -> {b}"), tb - ta)
                for (ta, a), (tb, b) in zip(points, points[1:])]
    return segments, end - start, wall, ""


# ---------------------------------------------------------------- import-time profiles
def importtime_profile(python: str, args: list[str], shown: str, env: dict[str, str], cwd: str,
                       top: int, repeat: int = 5) -> list[tuple[int, int, str]]:
    """One ``-X importtime`` run is noisy: run it ``repeat`` times and show the median run."""
    argv = [python, "-X", "importtime", *args]
    runs = []
    for _ in range(repeat):
        proc = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
        runs.append((sum(r[1] for r in rows if not r[2].startswith("  ")), proc.returncode, rows, other))
    runs.sort(key=lambda r: r[0])
    total_top, returncode, rows, other = runs[len(runs) // 2]
    print(f"\nImport-time profile, {shown} (median of {repeat} runs by total):")
    print(f"  {os.path.basename(python)} -X importtime {' '.join(shlex.quote(a) for a in args)[:150]}"
          f"  (exit {returncode})")
    if not rows:
        print("  (no importtime output)")
        return rows

    def family(prefix: str) -> float:
        return sum(r[0] for r in rows if r[2].strip().split(".")[0] == prefix) / 1000

    print(f"  {len(rows)} modules imported, {total_top / 1000:.1f} ms in all (sum of top-level "
          f"cumulative); own time of dispatch.* {family('dispatch'):.1f} ms, asyncio.* "
          f"{family('asyncio'):.1f} ms")
    if top > 0:
        print(f"  top {top} by cumulative time:")
        print(f"  {'cumul ms':>9} {'self ms':>8}  module")
        for self_us, cum_us, name in sorted(rows, key=lambda r: -r[1])[:top]:
            print(f"  {cum_us / 1000:9.1f} {self_us / 1000:8.1f}  {name}")
    if other and returncode != 0:
        print("  stderr besides importtime:")
        for line in other[-10:]:
            print(f"    {line}")
    return rows



# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15, help="measured runs of each series (>= 10)")
    ap.add_argument("--timeline-runs", type=int, default=5,
                    help="straced runs for the timeline (median per step; 0 skips it)")
    ap.add_argument("--hostrun", metavar="PATH",
                    help="hostrun executable (default: <dir of sys.executable>/hostrun)")
    ap.add_argument("--address", default="127.0.0.2", help="loopback address of the peer's sshd")
    ap.add_argument("--seed", type=int, default=4, help="seed of the generated tree and the touches")
    ap.add_argument("--files", type=int, default=16800, help="small tracked files (default 16800)")
    ap.add_argument("--large", type=int, default=200, help="large tracked files (default 200)")
    ap.add_argument("--large-mb", type=int, default=240, help="their total size in MiB (default 240)")
    ap.add_argument("--ignored", type=int, default=3000, help="files under target/ (default 3000)")
    ap.add_argument("--top", type=int, default=12, help="import-time entries to show (default 12)")
    ap.add_argument("--snapshot", action="store_true",
                    help="run hostrun on a copy of dispatch/ taken at the start (PYTHONPATH), so edits "
                         "to the tree during the run cannot change the code measured")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory (tree, peer copy, traces); sshd, the master "
                         "and the cgroups are still removed")
    args = ap.parse_args()
    if args.runs < 10:
        ap.error("--runs must be at least 10 (medians of >= 10 runs)")
    if os.geteuid() != 0:
        sys.exit("bench: needs root (sshd privilege separation, memory cgroups)")
    for tool in ("ssh", "rsync", "git"):
        if shutil.which(tool) is None:
            sys.exit(f"bench: needs {tool}")
    if not os.path.exists("/usr/sbin/sshd"):
        sys.exit("bench: needs /usr/sbin/sshd (openssh-server)")
    have_strace = shutil.which("strace") is not None

    hostrun = find_hostrun(args.hostrun)
    python = interpreter_of(hostrun)
    tmp = tempfile.mkdtemp(prefix="hostrun-bench-peer-", dir="/tmp")
    own = (own_memory_cgroup() or "").rstrip("/")
    slice_rel = f"{own}/hostrun-bench-{os.getpid()}"
    peer_rel = f"{own}/hostrun-bench-{PEER}-{os.getpid()}"
    mount_ok = os.path.isdir(MEMORY_MOUNT)
    slice_dir = MEMORY_MOUNT + slice_rel if mount_ok else None
    peer_slice_dir = MEMORY_MOUNT + peer_rel if mount_ok else None
    state_dir = os.path.join(tmp, "state")
    peer: SshdPeer | None = None
    master: tuple[list[str], str, str] | None = None  # (ssh argv prefix, destination, control dir)
    cleaned = False
    try:
        # --- the tree ----------------------------------------------------------------------
        t0 = time.perf_counter()
        tree = make_tree(os.path.join(tmp, "tree"), args.seed, args.files, args.large, args.large_mb,
                         args.ignored)
        made = time.perf_counter() - t0
        files = sum(c[0] for c in tree.counts.values())
        size = sum(c[1] for c in tree.counts.values())
        mb = 1 << 20
        print(f"tree:         {tree.root}: {files} files, {size / mb:.0f} MiB "
              f"(tracked: {tree.counts['small'][0]} small = {tree.counts['small'][1] / mb:.0f} MiB, "
              f"{tree.counts['large'][0]} large = {tree.counts['large'][1] / mb:.0f} MiB; "
              f"ignored: {tree.counts['ignored'][0]} = {tree.counts['ignored'][1] / mb:.0f} MiB "
              f"under target/ and *.log); git repo, 1 commit; made in {made:.1f} s")

        # --- the peer and the configs -------------------------------------------------------
        root = Path(tmp) / f"peer-{PEER}"
        root.mkdir()
        peer = SshdPeer(root, PEER, args.address, peer_rel, slice="300M")
        peer.start()
        top = 'enable_across_machines = true\ntoolchain_probes = ["rsync --version"]\n'
        local = f'[hosts.local]\nslice = "300M"\ncgroup = "{slice_rel}"\n'
        config = os.path.join(tmp, "hosts.toml")
        with open(config, "w", encoding="utf-8") as fh:
            fh.write(f'state_dir = "{state_dir}"\n{top}\n{local}\n{peer.host_table()}')
        peer_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOME": str(peer.home), "HOSTRUN_CONFIG": str(peer.peer_config),
                    "XDG_CACHE_HOME": str(peer.home / ".cache"), "PYTHONDONTWRITEBYTECODE": "1"}
        peer_python = shutil.which("python3", path=peer_env["PATH"]) or "python3"
        # The timeline's config: the same, but the peer's "python" is a wrapper that stamps each
        # agent start (bash's $EPOCHREALTIME: no fork) and execs the real one.
        stamps = os.path.join(tmp, "peer-stamps.txt")
        wrapper = os.path.join(tmp, "stamp-python3")
        with open(wrapper, "w", encoding="utf-8") as fh:
            fh.write(f"#!/bin/bash\nprintf '%s %s\\n' \"$EPOCHREALTIME\" \"$3\" >> {shlex.quote(stamps)}\n"
                     f"exec {shlex.quote(peer_python)} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        config_tl = os.path.join(tmp, "hosts-timeline.toml")
        with open(config_tl, "w", encoding="utf-8") as fh:
            fh.write(f'state_dir = "{state_dir}"\n{top}\n{local}\n'
                     f'{peer.host_table(f"python = {json.dumps(wrapper)}")}')

        env = private_env(tmp)
        code_root = REPO
        if args.snapshot:  # hostrun imports this copy of dispatch/ (PYTHONPATH comes before the .pth)
            code_root = os.path.join(tmp, "snapshot")
            shutil.copytree(os.path.join(REPO, "dispatch"), os.path.join(code_root, "dispatch"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (code_root, env.get("PYTHONPATH")) if p)
        env_cached = dict(env, PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        env_cached.pop("PYTHONDONTWRITEBYTECODE", None)
        tree_before = sources_digest(REPO)
        proc = subprocess.run([python, "-c", INTROSPECT, config, PEER], env=env, cwd=tmp,
                              capture_output=True, text=True)
        info: dict[str, Any] = json.loads(proc.stdout) if proc.returncode == 0 else {}
        if not info:
            print(f"bench: warning: cannot read PeerClient(...).ssh from hostrun's code (using what "
                  f"hostrun ran instead): {proc.stderr.strip()[-300:]}", file=sys.stderr)

        version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip()
        peer_version = subprocess.run([peer_python, "-c", "import sys; print(sys.version.split()[0])"],
                                      capture_output=True, text=True).stdout.strip()
        rsync_version = subprocess.run(["rsync", "--version"], capture_output=True,
                                       text=True).stdout.splitlines()[0]
        ssh_version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
        print(f"hostrun:      {hostrun}")
        print(f"interpreter:  {python} (Python {version}); code {code_root}/dispatch"
              f"{' (snapshot, on PYTHONPATH)' if args.snapshot else ''}")
        print(f"config:       {config} (state_dir {state_dir}; probes {info.get('probes')})")
        print(f"slices:       local {slice_dir or '(hostrun default)'}\n"
              f"              {PEER} {peer_slice_dir or '(hostrun default)'}")
        print(f"peer:         sshd on {peer.address}:{peer.port} (this machine; ssh_config "
              f"{peer.ssh_config}); agent runs on {peer_python} (Python {peer_version})")
        print(f"tools:        {ssh_version}; {rsync_version}")
        print(f"machine:      {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        print(f"environment:  PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")

        # --- warm-up; the second run with ssh/rsync wrappers that record what hostrun runs ----------
        hostrun_true = [hostrun, "--config", config, "--peer", "--", "true"]
        capture_dir, capture_log = os.path.join(tmp, "capture-bin"), os.path.join(tmp, "capture-log")
        capture_bin(capture_dir, capture_log)
        env_capture = dict(env, PATH=f"{capture_dir}{os.pathsep}{env.get('PATH', '')}")
        for i, (what, run_env) in enumerate((
                ("config validation, agent upload, master start, first full sync", env),
                ("its sync record removed, so it rsyncs in full; ssh and rsync recorded", env_capture))):
            if i == 1:  # hostrun would skip the rsync (nothing changed): make it run, to record it
                records = os.path.join(state_dir, "peer-sync")
                for name in os.listdir(records) if os.path.isdir(records) else []:
                    os.unlink(os.path.join(records, name))
            t0 = time.perf_counter()
            proc = subprocess.run(hostrun_true, env=run_env, cwd=tree.root, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            print(f"warm-up {i + 1} ({what}): {wall * 1000:.1f} ms, exit {proc.returncode}")
            if proc.returncode != 0:
                print(f"hostrun --peer failed in the warm-up:\n{proc.stdout}\n{proc.stderr}",
                      file=sys.stderr)
                return 1
        calls = captured(capture_log)
        # Expected: one ssh session running `agent run` (spec on stdin; probe, P, G, the job), one rsync (the
        # sync; -e, with its own ssh under it), and the local toolchain probes when their cached output
        # was stale (the rsync wrapper is another binary: its fingerprint differs, so it runs here).
        probe_words = {tuple(shlex.split(p)) for p in info.get("probes") or ["rsync --version"]}
        probe_words.add(("rsync", "--help"))  # whether rsync has -s (cached per rsync binary)
        syncs: list[list[str]] = []
        sessions: list[tuple[list[str], tuple[str, str, list[str]]]] = []
        local_probes: list[str] = []
        other: list[str] = []
        for prog, a in calls:
            call = agent_call(a[-1]) if prog == "ssh" and a else None
            if prog == "rsync" and "-e" in a:
                syncs.append(a)
            elif (prog, *a) in probe_words:
                local_probes.append(shlex.join([prog, *a]))
            elif prog == "ssh" and "--server" in a and any(w.split()[-1:] == ["rsync"] or
                                                           os.path.basename(w) == "rsync" for w in a):
                continue  # rsync's own transport
            elif call is not None and call[2][:2] and call[2][0] == "run":
                sessions.append((a, call))
            else:
                other.append(f"{prog} {shlex.join(a)[:160]}")
        spec: dict[str, Any] = {}
        made = subprocess.run([python, "-c", SPEC_OF, config, PEER, tree.root], env=env, cwd=tree.root,
                              capture_output=True, text=True)
        try:
            spec = json.loads(base64.b64decode(made.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            print(f"bench: cannot build hostrun's spec: {made.stderr.strip()[-300:]}", file=sys.stderr)
        if len(syncs) != 1 or len(sessions) != 1 or other or "prepare" not in spec:
            print(f"bench: expected from hostrun one ssh session running `agent run` "
                  f"and one rsync (plus local toolchain probes); recorded: "
                  f"{[(p, [*a[:3], '...', a[-1][:80]]) for p, a in calls]}; unexpected: {other}; "
                  f"spec keys: {sorted(spec)}", file=sys.stderr)
            return 1
        hostrun_rsync = ["rsync", *syncs[0]]
        dest, _, hostrun_remote = syncs[0][-1].partition(":")
        hostrun_remote = hostrun_remote.rstrip("/")
        # By hand keeps its own copy beside hostrun's: an rsync into hostrun's copy would be a change
        # there that hostrun's next run must (and does) repair with a full rsync.
        remote = f"{hostrun_remote}-byhand"
        rsync_args = [*syncs[0][:-1], f"{dest}:{remote}/"]
        rsync_cmd = ["rsync", *rsync_args]
        rsh = rsync_args[rsync_args.index("-e") + 1]
        session_argv, (agent_rel, agent_py, agent_args) = sessions[0]
        session_cmd = ["ssh", *session_argv]
        prepare = spec["prepare"]
        prepare_json = json.dumps(prepare)
        full_spec = json.dumps(spec).encode()
        plain_spec = json.dumps({k: v for k, v in spec.items() if k != "prepare"}).encode()
        ssh_prefix = ["ssh", *session_argv[:-1]]  # hostrun's session argv: options, -T, peer1, --
        ssh_cd = [*ssh_prefix, f"cd {shlex.quote(remote)} && true"]
        # sshd starts in the passwd home; the peer's HOME (SetEnv) is where the agent lives, as in _RUN
        probe_ssh = [*ssh_prefix, 'cd "$HOME" && ' + shlex.join([agent_py, "-I", agent_rel, "probe",
                                                                  "--spec", prepare_json])]
        ctl_dir = str(info.get("ctl_dir") or "")
        if not ctl_dir:
            paths = [w.split("=", 1)[1] for w in session_argv if w.startswith("ControlPath=")]
            ctl_dir = os.path.dirname(paths[0]) if paths else os.path.join(state_dir, "ssh")
        master = ([a for a in ssh_prefix if a not in ("-T", "--")][:-1], dest, ctl_dir)
        missing = [f for f in SYNC_FLAGS if f not in rsync_args]
        extra = [a for a in rsync_args[:-2] if a not in SYNC_FLAGS and a not in ("-e", rsh)]
        agent_file = peer.home / agent_rel
        if not (agent_file / "__main__.py").is_file() or not os.path.isdir(hostrun_remote):
            print(f"bench: agent directory {agent_file} or remote dir {remote} missing after the warm-up",
                  file=sys.stderr)
            return 1
        agent_dir = agent_file.parent
        agent_mtime = agent_file.stat().st_mtime_ns
        agents_before = agents_in(agent_dir)
        sources = sum(1 for _ in agent_file.rglob("*.py"))
        compiled = sum(1 for _ in agent_file.rglob("__pycache__/*.pyc"))
        agent_kind = f"unpacked: {sources} .py, {compiled} .pyc under __pycache__"
        # the local probe's cache now holds the wrapper's fingerprint: one plain run caches the real one
        t0 = time.perf_counter()
        proc = subprocess.run(hostrun_true, env=env, cwd=tree.root, capture_output=True, text=True)
        print(f"warm-up 3 (local toolchain probe cached again for the real rsync): "
              f"{(time.perf_counter() - t0) * 1000:.1f} ms, exit {proc.returncode}")
        if proc.returncode != 0:
            print(f"hostrun --peer failed in the warm-up:\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
            return 1
        t0 = time.perf_counter()
        warm = [subprocess.run(a, cwd=tree.root, env=env, capture_output=True) for a in (rsync_cmd, ssh_cd)]
        print(f"warm-up 4 (by hand): {(time.perf_counter() - t0) * 1000:.1f} ms, exit "
              f"{[p.returncode for p in warm]}")
        if any(p.returncode != 0 for p in warm):
            print(f"by-hand run failed: {[p.stderr for p in warm]}", file=sys.stderr)
            return 1
        master_before = master_check(master[0], dest)
        print(f"recorded:     {len(calls)} ssh/rsync calls from one `hostrun --peer -- true`: 1 ssh session "
              f"(agent {agent_args[0]}, spec with prepare: probes {prepare.get('probes')}, workdir "
              f"{prepare.get('workdir')}), 1 rsync (+ its own ssh), local probe(s): "
              f"{', '.join(local_probes) or 'none (cached)'}")
        print(f"session:      {shlex.join(session_cmd)[:200]}...")
        same = ("== PeerClient(...).ssh.rsync_rsh()" if rsh == info.get("rsh")
                else f"DIFFERS FROM PeerClient(...).ssh.rsync_rsh(): {info.get('rsh')}")
        print(f"rsync -e:     {rsh}\n              {same}")
        print(f"rsync flags:  hostrun's = issue 4's list {'+ ' + ' '.join(extra) if extra else '(exactly)'}"
              f"{'; MISSING ' + ' '.join(missing) if missing else ''} (the by-hand rsync uses hostrun's)")
        print(f"remote dir:   {dest}:{hostrun_remote} (hostrun's); by hand: {dest}:{remote}")
        print(f"agent:        {agent_file} ({agent_kind}), present before timing")
        print(f"master:       {master_before or 'NOT RUNNING'}")
        print(f"by hand:      {shlex.join(rsync_cmd)}\n              {shlex.join(ssh_cd)}")

        # --- the targets ---------------------------------------------------------------------
        rng = random.Random(args.seed + 1)
        lines = source_lines(random.Random(args.seed + 2), 4000)

        def touch() -> list[str]:
            return touch_files(tree, rng, lines, TOUCHED)

        def arrived_in(copy: str) -> Callable[[object], str | None]:
            return lambda token: arrived(token, copy)

        def arrived(token: object, copy: str) -> str | None:
            stale = []
            for rel in token:  # type: ignore[attr-defined]
                with open(os.path.join(tree.root, rel), "rb") as a:
                    ours = a.read()
                try:
                    with open(os.path.join(copy, rel), "rb") as b:
                        theirs: bytes | None = b.read()
                except OSError:
                    theirs = None
                if ours != theirs:
                    stale.append(rel)
            return f"{len(stale)} touched file(s) not synced: {stale[:3]}" if stale else None

        main_series = [
            Series("h0", "no change: hostrun --peer -- true", [hostrun_true], env, tree.root),
            Series("b0", "no change: by hand (rsync; ssh 'cd DIR && true')", [rsync_cmd, ssh_cd], env,
                   tree.root),
            Series("h10", f"{TOUCHED} touched: hostrun --peer -- true", [hostrun_true], env, tree.root,
                   before=touch, after=arrived_in(hostrun_remote)),
            Series("b10", f"{TOUCHED} touched: by hand (rsync; ssh 'cd DIR && true')",
                   [rsync_cmd, ssh_cd], env, tree.root, before=touch, after=arrived_in(remote)),
        ]
        run_phase(main_series, args.runs)
        med = print_table(f"TARGETS: {args.runs} runs each, interleaved, warm ControlMaster",
                          main_series)
        ok = True
        print()
        for case, h, b in (("no change", "h0", "b0"), (f"{TOUCHED} touched", "h10", "b10")):
            ratio = med[h] / med[b]
            verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
            stretch = "met" if ratio < STRETCH_RATIO else "not met"
            ok &= verdict == "PASS"
            print(f"  {case:11}: hostrun / by hand = {ratio:.2f}x "
                  f"(hostrun {(med[h] - med[b]) * 1000:+.1f} ms)  target <= {TARGET_RATIO}x -> {verdict}; "
                  f"stretch < {STRETCH_RATIO:.1f}x {stretch}")
        failures = [f for s in main_series for f in s.failures]
        notes: list[str] = []

        # --- where the time goes: parts --------------------------------------------------------
        # the agent without its bytecode (run with -B: nothing written): what shipping it compiled saves
        src_copy = os.path.join(str(peer.home), "bench", "agent-src")
        shutil.copytree(agent_file, src_copy, ignore=shutil.ignore_patterns("__pycache__"))
        agent_here = [peer_python, "-I", str(agent_file)]
        changed_list = os.path.join(tmp, "changed.txt")

        def touch_listed() -> list[str]:
            chosen = touch()
            with open(changed_list, "w", encoding="utf-8") as fh:
                fh.write("\n".join(chosen) + "\n")
            return chosen

        rsync_changed = [*(a for a in rsync_cmd[:-2] if a != "--delete"), f"--files-from={changed_list}",
                         *rsync_cmd[-2:]]
        for _ in range(3):  # fill the private bytecode cache
            subprocess.run(hostrun_true, env=env_cached, cwd=tree.root, capture_output=True)
        parts = [
            Series("ssh", "ssh peer1 true (hostrun's ssh argv, warm master)", [[*ssh_prefix, "true"]],
                   env, tree.root),
            Series("ssh_cd", "ssh peer1 'cd DIR && true' (the by-hand ssh)", [ssh_cd], env, tree.root),
            Series("rsync", "rsync alone, no change (the by-hand rsync)", [rsync_cmd], env, tree.root),
            Series("ssh_py", f"ssh peer1 {agent_py} -I -c pass", [[*ssh_prefix, f"{agent_py} -I -c pass"]],
                   env, tree.root),
            FramedSeries("session", "ssh peer1 <hostrun's session replayed; G at once on P>",
                         session_cmd, env, tree.root, full_spec),
            Series("probe_ssh", "ssh peer1 python3 -I <agent dir> probe --spec <prepare>",
                   [probe_ssh], env, tree.root),
            FramedSeries("agent_session", "python3 -I <agent dir> run <spec> (here, no ssh; G on P)",
                         [*agent_here, *agent_args], peer_env, str(peer.home), full_spec),
            Series("agent_probe", "python3 -I <agent dir> probe --spec ... (here, no ssh)",
                   [[*agent_here, "probe", "--spec", prepare_json]], peer_env, str(peer.home)),
            FramedSeries("agent_run", "python3 -I <agent dir> run <spec w/o prepare> (here)",
                         [*agent_here, "run"], peer_env, str(peer.home), plain_spec, expect_p=False),
            Series("agent_src", "  the probe, agent without __pycache__ (-B) [src]",
                   [[peer_python, "-I", "-B", src_copy, "probe", "--spec", prepare_json]], peer_env,
                   str(peer.home)),
            Series("local_true", "hostrun -- true (a local run: the same run_local, here)",
                   [[hostrun, "--config", config, "--", "true"]], env, tree.root),
            Series("py_peer", "python3 -I -c pass (the peer's python, no ssh)",
                   [[peer_python, "-I", "-c", "pass"]], peer_env, str(peer.home)),
            Series("py", "python -c pass (hostrun's interpreter)", [[python, "-c", "pass"]], env, tmp),
            Series("h_cached", "hostrun --peer -- true, .pyc cached [*]", [hostrun_true], env_cached,
                   tree.root),
            Series("git_top", "git rev-parse --show-toplevel (in the tree)",
                   [["git", "rev-parse", "--show-toplevel"]], env, tree.root),
            Series("rsync_changed", f"rsync --files-from=<the {TOUCHED} just touched> (no walk)",
                   [rsync_changed], env, tree.root, before=touch_listed, after=arrived_in(remote)),
            Series("git_status", "git status --porcelain (fingerprint candidate)",
                   [["git", "status", "--porcelain"]], env, tree.root),
            Series("walk", "python: scandir+stat walk of the tree (fingerprint candidate)",
                   [[python, "-c", WALK, tree.root]], env, tmp),
        ]
        run_phase(parts, args.runs)
        pmed = print_table(f"PARTS: {args.runs} runs each, interleaved (same master, same tree)", parts)
        # git's untracked cache (an index extension; .git is never synced) roughly halves git status here
        subprocess.run(["git", "-C", tree.root, "config", "core.untrackedCache", "true"], check=True)
        subprocess.run(["git", "-C", tree.root, "update-index", "--untracked-cache"], check=True)
        subprocess.run(["git", "-C", tree.root, "status", "--porcelain"], capture_output=True, check=True)
        uc = [Series("git_status_uc", "git status --porcelain, core.untrackedCache=true",
                     [["git", "status", "--porcelain"]], env, tree.root)]
        run_phase(uc, args.runs)
        pmed.update(print_table(f"then, after `git update-index --untracked-cache`, {args.runs} runs", uc))
        parts += uc
        walk_out = next(x for x in parts if x.key == "walk").last_stdout.decode().split()
        failures += [f for s in parts for f in s.failures]

        # --- where the time goes: hostrun's local steps, in-process ------------------------------
        steps: dict[str, dict[str, list[float]]] = {}
        for name, run_env in (("as is", env), ("[*]", env_cached)):
            for _ in range(args.runs):
                proc = subprocess.run([python, "-c", INPROC, config], env=run_env, cwd=tmp,
                                      capture_output=True, text=True)
                try:
                    for label, ms in json.loads(proc.stdout):
                        steps.setdefault(label, {}).setdefault(name, []).append(ms)
                except ValueError:
                    notes.append(f"in-process steps: {proc.stderr.strip()[-200:]}")
                    break
        if steps:
            print(f"\nLOCAL STEPS, in-process (python -c; median of {args.runs} runs each; ms): "
                  f"{'as is':>8} {'[*]':>8}")
            for label, by_env in steps.items():
                cells = [statistics.median(by_env[k]) if k in by_env and None not in by_env[k] else None
                         for k in ("as is", "[*]")]
                shown = " ".join(f"{c:8.1f}" if c is not None else f"{'-':>8}" for c in cells)
                print(f"  {label:66} {shown}")

        # --- where the time goes: the sync check, in-process, both sides --------------------------
        # The parts touched the tree: one run brings the record and the manifest up to date, and one
        # after RACY_NS keeps the listings the first had to read again (as a run in the series would).
        for pause in (0.0, 2.2):
            time.sleep(pause)
            subprocess.run(hostrun_true, env=env, cwd=tree.root, capture_output=True)
        check: dict[str, list[float]] = {}
        for _ in range(args.runs):
            for argv_, run_env, cwd_ in (
                    ([python, "-c", SYNC_HERE, state_dir, tree.root], env, tmp),
                    ([peer_python, "-I", "-c", SYNC_PEER, str(agent_file), hostrun_remote], peer_env,
                     str(peer.home))):
                proc = subprocess.run(argv_, env=run_env, cwd=cwd_, capture_output=True, text=True)
                try:
                    for label, ms in json.loads(proc.stdout):
                        check.setdefault(label, []).append(ms)
                except ValueError:
                    notes.append(f"sync check steps: {proc.stderr.strip()[-200:]}")
        if check:
            print(f"\nSYNC CHECK, in-process (median of {args.runs} runs each, after the series: nothing "
                  f"changed; ms)")
            for label, values in check.items():
                print(f"  {label:86} {statistics.median(values):8.1f}")

        # --- where the time goes: timeline ------------------------------------------------------
        segs: dict[str, list[float]] = {}
        totals: list[float] = []
        if have_strace and args.timeline_runs > 0:
            hostrun_tl = [hostrun, "--config", config_tl, "--peer", "--", "true"]
            subprocess.run(hostrun_tl, env=env, cwd=tree.root, capture_output=True)  # its config cache
            walls: list[float] = []
            order: list[str] = []
            for i in range(args.timeline_runs):
                got, total, wall, problem = timeline_once(hostrun_tl, env, tree.root,
                                                          os.path.join(tmp, f"strace-{i}.txt"), stamps)
                if problem:
                    notes.append(f"timeline run {i}: {problem}")
                    continue
                walls.append(wall)
                totals.append(total)
                labels = [f"{j + 1:2d}. {label}" for j, (label, _) in enumerate(got)]
                if not order:
                    order = labels
                for label, (_, value) in zip(labels, got):
                    segs.setdefault(label, []).append(value)
            if totals:
                total = statistics.median(totals)
                print(f"\nTIMELINE of hostrun --peer -- true, no change: median of {len(totals)} run(s) "
                      f"under strace -f --seccomp-bpf -e trace=execve,write (raw); the agent's start "
                      f"stamped on the peer by a bash wrapper (exec's python3); one ssh session, rsync "
                      f"inside it")
                print(f"  (from hostrun's exec to its exit {total * 1000:.1f} ms; wall with strace "
                      f"{statistics.median(walls) * 1000:.1f} ms; unstraced median above "
                      f"{med['h0'] * 1000:.1f} ms)")
                for label in order:
                    v = statistics.median(segs[label])
                    print(f"  {v * 1000:8.1f} ms {v / total * 100:5.1f}%  {label}")
                if any(len(v) != len(totals) for v in segs.values()):
                    notes.append("timeline: the runs did not all take the same steps")
        elif not have_strace:
            print("\nTIMELINE: skipped (no strace)")

        # --- import-time profiles ---------------------------------------------------------------
        importtime_profile(python, ["-m", "dispatch", "--config", config, "--peer", "--", "true"],
                           "the local side of `--peer -- true`", env, tree.root, args.top)
        importtime_profile(peer_python, ["-I", str(agent_file), "probe", "--spec", prepare_json],
                           "the agent's probe (as shipped, byte-compiled)", peer_env, str(peer.home),
                           args.top)
        importtime_profile(peer_python,
                           ["-I", "-c", f"import sys; sys.path.insert(0, {str(agent_file)!r}); "
                                        f"{RUN_PATH_MODULES}"],
                           "the agent's run-path modules (as shipped)", peer_env, str(peer.home), args.top)

        # --- summary ---------------------------------------------------------------------------
        def m(key: str) -> float:
            return pmed[key] * 1000 if key in pmed else float("nan")

        def seg(*labels: str) -> float:
            return sum(statistics.median(v) for k, v in segs.items()
                       if k.split(". ", 1)[1] in labels) * 1000

        def step_ms(prefix: str) -> float:
            for label, by_env in steps.items():
                if label.startswith(prefix) and None not in by_env.get("as is", [None]):
                    return statistics.median(by_env["as is"])
            return float("nan")

        h0, b0 = med["h0"] * 1000, med["b0"] * 1000
        # the local Python before the session: interpreter, imports, config, the agent's name
        local_est = m("py") + sum(step_ms(p) for p in (
            "import dispatch.cli.main", "then import dispatch.hosts.ssh.peerrun", "load_settings",
            "agent.remote_path"))
        to_p, after_g = m(f"session:{TO_P}"), m(f"session:{AFTER_G}")
        print("\nWHERE THE TIME GOES (medians, ms; no-change case)")
        print(f"  hostrun {h0:.1f} vs by hand {b0:.1f} ({h0 - b0:+.1f}); by hand = rsync {m('rsync'):.1f} "
              f"+ ssh 'cd DIR && true' {m('ssh_cd'):.1f}")
        known = (SEG_START, SEG_GIT, SEG_GLUE, SEG_EXIT, SEG_SSH, SEG_TO_P, SEG_RSYNC, SEG_WAIT_G,
                 SEG_AFTER_G, SEG_TO_G)
        if segs:
            others = sum(statistics.median(v) for k, v in segs.items()
                         if k.split(". ", 1)[1] not in known) * 1000
            print(f"  timeline ({statistics.median(totals) * 1000:.1f} under strace): local start-up "
                  f"{seg(SEG_START):.1f} + git {seg(SEG_GIT):.1f} + local glue {seg(SEG_GLUE, SEG_EXIT):.1f} "
                  f"| the session: ssh to the agent's start {seg(SEG_SSH):.1f} + the agent to its P frame "
                  f"and the compare here {seg(SEG_TO_P):.1f} + rsync {seg(SEG_RSYNC):.1f} + rsync's exit "
                  f"to G {seg(SEG_WAIT_G):.1f} (no rsync: the agent's start to G {seg(SEG_TO_G):.1f}) "
                  f"+ the run after G {seg(SEG_AFTER_G):.1f}"
                  f"{f' + other {others:.1f}' if others else ''}")
        print(f"  the session replayed without rsync (G at once on P): {m('session'):.1f} = to P {to_p:.1f} "
              f"+ after G {after_g:.1f}; the same here without ssh: {m('agent_session'):.1f} = "
              f"{m(f'agent_session:{TO_P}'):.1f} + {m(f'agent_session:{AFTER_G}'):.1f} (ssh true: "
              f"{m('ssh'):.1f})")
        print(f"  to P: the agent's probe command alone {m('agent_probe'):.1f} here, {m('probe_ssh'):.1f} "
              f"over ssh; the peer's python -I -c pass {m('py_peer'):.1f} here, {m('ssh_py'):.1f} over ssh; "
              f"the probe without the agent's bytecode [src] {m('agent_src'):.1f} ({agent_kind})")
        print(f"  after G: the agent's run path alone (spec without prepare, its own process) "
              f"{m('agent_run'):.1f} here; a local `hostrun -- true` (same run_local) "
              f"{m('local_true'):.1f}; the by-hand ssh 'cd DIR && true' {m('ssh_cd'):.1f}")
        print(f"  local start-up: python -c pass {m('py'):.1f}; import dispatch.cli.main "
              f"{step_ms('import dispatch.cli.main'):.1f} then dispatch.hosts.ssh.peerrun "
              f"{step_ms('then import dispatch.hosts.ssh.peerrun'):.1f}, "
              f"config {step_ms('load_settings'):.1f}, "
              f"agent name {step_ms('agent.remote_path'):.1f}, probe here "
              f"{step_ms('toolchain probe_here'):.1f} (in-process); with hostrun's bytecode cached [*] "
              f"a whole run took {m('h_cached'):.1f} vs {h0:.1f} as is")
        print(f"  so hostrun - by hand {h0 - b0:+.1f} ~ hostrun - replayed session - rsync "
              f"{h0 - m('session') - m('rsync'):.1f} (local Python ~{local_est:.0f} + glue + waits) "
              f"+ the session beyond the by-hand ssh {m('session') - m('ssh_cd'):.1f}")
        files_seen = walk_out[0] if walk_out else "?"
        walk_ms = walk_out[2] if len(walk_out) > 2 else "?"
        print(f"  rsync alone {m('rsync'):.1f}; fingerprint candidates: git status --porcelain "
              f"{m('git_status'):.1f} ({m('git_status_uc'):.1f} with the untracked cache); a Python "
              f"stat walk {m('walk'):.1f} wall ({walk_ms} in-process, "
              f"{files_seen} entries); rsync of just the {TOUCHED} touched files (--files-from) "
              f"{m('rsync_changed'):.1f}")
        def ck(prefix: str) -> float:
            found = [statistics.median(v) for k, v in check.items() if k.startswith(prefix)]
            return found[0] if found else float("nan")

        here_check = sum(ck(p) for p in ("here: load", "here: walk the tree, reusing", "here: compare"))
        peer_check = ck("peer: check_copy")
        print(f"  the sync check (in-process, nothing changed): here {here_check:.1f} = record "
              f"{ck('here: load'):.1f} + walk {ck('here: walk the tree, reusing'):.1f} + compare "
              f"{ck('here: compare'):.1f} (a walk without listings {ck('here: walk the tree without'):.1f}); "
              f"on the peer {peer_check:.1f} = manifest {ck('peer: read'):.1f} + walk "
              f"{ck('peer: walk the copy, reusing'):.1f} + compare {ck('peer: compare'):.1f} (without "
              f"listings {ck('peer: walk the copy without'):.1f}); both at once, the peer's after its start")
        print(f"  so with nothing changed: hostrun {h0:.1f} - the peer's check {peer_check:.1f} = "
              f"{h0 - peer_check:.1f} -> {(h0 - peer_check) / b0:.2f}x is what the rest costs (start-up, "
              f"session, run); the check itself is one lstat per file on each side")
        print(f"  {TOUCHED} touched: hostrun {med['h10'] * 1000:.1f} vs by hand {med['b10'] * 1000:.1f}; "
              f"an rsync of just those files (--files-from, by hand) {m('rsync_changed'):.1f} against the "
              f"full rsync {m('rsync'):.1f}")

        # --- checks and leftovers ------------------------------------------------------------
        master_after = master_check(master[0], dest)
        if master_before != master_after or not master_after:
            print(f"\nWARNING: the master changed during the bench: {master_before!r} -> {master_after!r}")
            ok = False
        agents = agents_in(agent_dir)
        resent = agent_file.stat().st_mtime_ns != agent_mtime or agents != agents_before
        print(f"\nagent on the peer: {', '.join(agents)}; sent during timing: "
              f"{'YES (an upload was timed)' if resent else 'no'}")
        ok &= not resent
        if sources_digest(REPO) != tree_before:
            if args.snapshot:
                print("(dispatch/*.py changed in the tree while the bench ran; the runs used the "
                      "snapshot taken at the start)")
            else:
                print("WARNING: dispatch/*.py changed while the bench ran: the runs measured different "
                      "code; rerun on a quiet tree or with --snapshot")
                ok = False
        check = subprocess.run([*hostrun_rsync[:1], "--dry-run", "--itemize-changes", *hostrun_rsync[1:]],
                               capture_output=True, text=True)
        differs = [line for line in check.stdout.splitlines() if line.strip()]
        print(f"peer copy identical to the tree (rsync --dry-run): "
              f"{'yes' if check.returncode == 0 and not differs else 'NO: ' + str(differs[:5])}")
        ok &= check.returncode == 0 and not differs
        for note in notes:
            print(f"note: {note}")
        if failures:
            ok = False
            print(f"{len(failures)} run(s) failed:")
            for line in failures[:10]:
                print(f"  {line}")
        stop_master(*master)
        peer.stop()
        peer_root, peer, cleaned = str(peer.root), None, True
        left = ledger_leftovers(state_dir, "local") + ledger_leftovers(os.path.join(peer_root, "state"), PEER)
        left += cgroup_leftovers(slice_dir, "local") + cgroup_leftovers(peer_slice_dir, PEER)
        left += [f"process {pid} still names {ctl_dir}" for pid in pids_with(ctl_dir.rstrip("/") + "/")]
        left += [f"process {pid} still names {peer_root}" for pid in pids_with(peer_root + "/")]
        print("leftovers after all runs: " + ("none" if not left else ""))
        for line in left:
            print(f"  {line}")
        print(f"\nresult: {'PASS' if ok and not left else 'FAIL'}")
        return 0 if ok and not left else 1
    finally:  # each step on its own: one failing must not leave the others undone
        steps_left: list[Callable[[], object]] = [lambda: remove_slice(slice_dir),
                                                  lambda: remove_slice(peer_slice_dir)]
        if peer is not None:
            steps_left.insert(0, peer.stop)
        if not cleaned:  # whatever master this run started, by its control directory
            steps_left.insert(0, lambda: stop_master(*(master or ([], PEER, os.path.join(state_dir, "ssh")))))
        for step in steps_left:
            try:
                step()
            except Exception as exc:
                print(f"bench: warning: cleanup step failed: {exc!r}", file=sys.stderr)
        if args.keep:
            print(f"kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
