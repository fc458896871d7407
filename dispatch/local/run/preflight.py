"""Preflight: whether a script should run at all, from what it declares about itself (docs/design.md,
"Guards"; docs/preflight.md).

A script declares, in its leading comment block (``dispatch.guards.headers``)::

    # admission: inputs-changed PATH... env:VAR...   worth running? only if an input changed
    # run-condition: command TOOL...                 can this host run it? each TOOL on PATH
    # run-condition: single-instance                 no other instance of this script on this host
    # run-condition: device gpu                      a GPU present (and not hidden by CUDA_VISIBLE_DEVICES)
    # run-condition: min-free SIZE                   at least SIZE of slice room now

Admission compares a fingerprint of the inputs (file contents hashed, directories walked in byte
order of their names; variables hashed, never stored) with the one recorded at the script's last
successful run, per script, arguments and host. The record is written only after the job exited 0,
and it is the fingerprint taken *before* the run, so an input changed while the job ran (or waited)
makes the next call run again. Relative PATHs are relative to the script's directory (as named, like
``dirname "$0"``).

``single-instance`` is an exclusive ``flock`` on a lock file named by the script's real path, taken
without waiting and held for the whole run. The kernel drops it when its holders are gone, so a
SIGKILLed hostrun cannot leave it behind; hostrun's guardian (forked after the lock was taken) shares
it until the job's cgroup has been emptied.

The headers are parsed in ``dispatch.local.run.preflightparse`` (``declared``); this module checks them.
Everything lives in ``<state_dir>/preflight/`` (mode 0700; files 0600). Standard library only: the
same checks run on a peer, inside the agent. Heavy or slow imports (``json``, ``shlex``, the ledger,
nvidia-smi) happen only for a script that declares something.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from dispatch.core.atomicfile import write_atomic
from dispatch.core.records import NamedTuple
from dispatch.local.run.preflightparse import ADMISSION as ADMISSION
from dispatch.local.run.preflightparse import ADMISSION_KINDS as ADMISSION_KINDS
from dispatch.local.run.preflightparse import CONDITION_KINDS as CONDITION_KINDS
from dispatch.local.run.preflightparse import DEVICES as DEVICES
from dispatch.local.run.preflightparse import RUN_CONDITION as RUN_CONDITION
from dispatch.local.run.preflightparse import Condition as Condition
from dispatch.local.run.preflightparse import Script as Script
from dispatch.local.run.preflightparse import declared as declared
from dispatch.local.run.preflightparse import parse_condition as parse_condition

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.core.settings import Settings

STATE_SUBDIR = "preflight"
LOCK_PATIENCE = 0.25  # a `hostrun preflight` probe holds the lock for microseconds: retry that long
CHUNK = 1 << 20


class Check(NamedTuple):
    condition: Condition
    met: bool
    detail: str


class PreflightResult(NamedTuple):
    script: Script
    checks: tuple[Check, ...]
    forced: bool = False

    @property
    def unmet(self) -> list[Check]:
        return [c for c in self.checks if not c.met]

    @property
    def runs(self) -> bool:
        """Every run-condition met, and the admission met or overridden by ``--force``."""
        return all(c.condition.header == ADMISSION and self.forced for c in self.unmet)

    @property
    def nothing_to_do(self) -> bool:
        """Only the admission is unmet: the inputs are unchanged (a skip, not a failure)."""
        return bool(self.unmet) and all(c.condition.header == ADMISSION for c in self.unmet)

    def unmet_lines(self) -> list[str]:
        """One line per unmet condition, as hostrun prints them before exiting 78."""
        return [f"preflight: unmet: {c.condition.text} ({c.detail})" for c in self.unmet]

    def summary(self) -> str:
        """One line: what happens (a skip reads "nothing to do", never like a failure)."""
        name = self.script.path
        if self.nothing_to_do:
            c = self.unmet[0]
            if self.runs:
                return f"preflight: {name}: {c.condition.text}: {c.detail}; running anyway (--force)"
            return (f"preflight: nothing to do for {name}: {c.condition.text}: {c.detail}; nothing ran "
                    "(--force runs it anyway)")
        if self.runs:
            return f"preflight: {name}: every declared condition is met"
        n = len(self.unmet)
        return f"preflight: {n} condition{'s' if n != 1 else ''} unmet for {name}; nothing ran"

    def as_dict(self) -> dict[str, Any]:
        return {
            "script": self.script.path, "args": list(self.script.args), "would_run": self.runs,
            "nothing_to_do": self.nothing_to_do, "forced": self.forced,
            "exit_code": 0 if self.runs else 78,
            "conditions": [
                {"line": c.condition.line, "header": c.condition.header, "kind": c.condition.kind,
                 "args": list(c.condition.args), "text": c.condition.text, "met": c.met,
                 "detail": c.detail}
                for c in self.checks
            ],
        }


def report_lines(verdict: PreflightResult) -> list[str]:
    """``hostrun preflight``'s text: a headline, then one line per condition."""
    v, name = verdict, verdict.script.path
    if not v.checks:
        head = f"{name}: would run (it declares no preflight condition)"
    elif v.runs:
        head = f"{name}: would run" + (" (--force: its inputs are unchanged)" if v.unmet else "")
    elif v.nothing_to_do:
        head = f"{name}: nothing to do, would not run (exit 78): its inputs are unchanged; --force runs it"
    else:
        n = len(v.unmet)
        head = f"{name}: would not run (exit 78): {n} condition{'s' if n != 1 else ''} unmet"
    return [head] + [f"  {'met  ' if c.met else 'UNMET'}  line {c.condition.line}: {c.condition.text}"
                     f" — {c.detail}" for c in v.checks]


# ----------------------------------------------------------------------------------------- checking
def check(settings: Settings, script: Script, environ: Mapping[str, str], *, force: bool = False,
          hold: bool = False) -> tuple[PreflightResult, Guard | None]:
    """Evaluate every condition, in the order declared. With ``hold``, a verdict that runs comes
    with a Guard: the single-instance lock, held until ``release``, and the fingerprint
    ``succeeded`` records. Without it (a dry run) nothing is held or written."""
    state = os.path.join(settings.state_dir, STATE_SUBDIR)
    checks: list[Check] = []
    lock_fd: int | None = None
    inputs: dict[str, str] | None = None
    try:
        for condition in script.conditions:
            if condition.kind == "inputs-changed":
                inputs = fingerprint(script, condition, environ)
                checks.append(_admission(condition, inputs, _load_record(state, script)))
            elif condition.kind == "command":
                missing = [t for t in condition.args if not on_path(t, environ)]
                checks.append(Check(condition, not missing, f"not on PATH: {', '.join(missing)}"
                                    if missing else "all on PATH"))
            elif condition.kind == "device":
                checks.append(_gpu(condition, environ))
            elif condition.kind == "min-free":
                checks.append(_min_free(condition, settings))
            elif condition.kind == "single-instance":
                fd, detail = _lock(state, script, hold)
                checks.append(Check(condition, fd is not None or detail.startswith("held by this"),
                                    detail))
                lock_fd = fd
        verdict = PreflightResult(script, tuple(checks), force)
        if not (hold and verdict.runs):
            return verdict, None
        guard = Guard(state, script, inputs, lock_fd)
        lock_fd = None
        return verdict, guard
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


class Guard:
    """A passed preflight, for the length of the run."""

    def __init__(self, state: str, script: Script, inputs: dict[str, str] | None,
                 lock_fd: int | None) -> None:
        self.state, self.script, self.inputs, self.lock_fd = state, script, inputs, lock_fd

    def succeeded(self) -> None:
        """The job exited 0: record the inputs' fingerprint taken before it ran."""
        if self.inputs is None:
            return
        import json

        record = {"script": self.script.real, "args": list(self.script.args),
                  "host": os.uname().nodename, "time": time.time(), "inputs": self.inputs}
        _ensure_private_dir(self.state)
        path = _state_path(self.state, self.script, ".json")
        write_atomic(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())

    def release(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def on_path(tool: str, environ: Mapping[str, str]) -> bool:
    """Whether ``tool`` would be found and executable, as the job's ``execvp`` would look."""
    if "/" in tool:
        return os.path.isfile(tool) and os.access(tool, os.X_OK)
    for directory in (environ.get("PATH") or os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", tool)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return True
    return False


def _gpu(condition: Condition, environ: Mapping[str, str]) -> Check:
    from dispatch.core.errors import GpuError
    from dispatch.local.gpus.gpu import read_gpus, visible

    try:
        gpus = read_gpus()
    except GpuError as exc:
        return Check(condition, False, f"cannot read the GPUs: {exc}")
    if not gpus:
        why = "nvidia-smi lists no GPU" if on_path("nvidia-smi", os.environ) else "nvidia-smi is not on PATH"
        return Check(condition, False, f"no GPU: {why}")
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    shown = visible(gpus, spec)
    if not shown:
        return Check(condition, False, f"CUDA_VISIBLE_DEVICES={spec!r} hides all {len(gpus)} GPU(s)")
    names = ", ".join(f"GPU {g.index} ({g.name})" for g in shown)
    return Check(condition, True, names)


def slice_room(settings: Settings) -> int:
    """This host's room now, as admission computes it: limit - running bookings - usage above them,
    or the machine's available memory when less (``dispatch.local.admission.rooms.room_function``)."""
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.admission.rooms import room_function
    from dispatch.local.hostslice import LocalSlice

    here = LocalSlice(settings)
    limit = here.limit
    ledger = Ledger(settings.state_dir, live_jobs=here.live_jobs)
    try:
        running = [b for b in ledger.bookings(here.host.name) if b.state == "running"]
    finally:
        ledger.close()
    return room_function(here.backend, limit)(running).free


def _min_free(condition: Condition, settings: Settings) -> Check:
    from dispatch.core.units import format_size

    assert condition.size is not None
    free = slice_room(settings)
    return Check(condition, free >= condition.size, f"slice room now {format_size(max(0, free))}, "
                 f"need {format_size(condition.size)}")


# ------------------------------------------------------------------------------ admission: inputs
def fingerprint(script: Script, condition: Condition, environ: Mapping[str, str]) -> dict[str, str]:
    """Each input, as written in the header, to a digest of its content (or of the variable)."""
    from dispatch.core.fingerprint import sha256

    digests: dict[str, str] = {}
    for arg in condition.args:
        if arg.startswith("env:"):
            value = environ.get(arg[4:])
            digests[arg] = "unset" if value is None else \
                str(sha256(b"set\0" + value.encode("utf-8", "surrogateescape")).hexdigest())
        else:
            digests[arg] = path_digest(os.path.join(script.directory, os.path.expanduser(arg)))
    return digests


def path_digest(path: str) -> str:
    """A file's content; a directory's names, kinds, link targets and file contents, recursively,
    in byte order of the names (symlinks are not followed inside it). ``missing`` if absent."""
    import stat

    from dispatch.core.fingerprint import sha256

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    h = sha256()
    if stat.S_ISDIR(st.st_mode):
        h.update(b"d\0")
        _walk(h, path, b"")
    elif stat.S_ISREG(st.st_mode):
        h.update(b"f\0" + _file_digest(path))
    else:
        h.update(b"o\0" + str(stat.S_IFMT(st.st_mode)).encode())
    return str(h.hexdigest())


def _walk(h: Any, directory: str, rel: bytes) -> None:
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: os.fsencode(e.name))
    except OSError as exc:
        h.update(b"!" + rel + b"\0" + str(exc.strerror).encode() + b"\0")
        return
    for entry in entries:
        name = rel + b"/" + os.fsencode(entry.name) if rel else os.fsencode(entry.name)
        try:
            if entry.is_symlink():
                h.update(b"l\0" + name + b"\0" + os.fsencode(os.readlink(entry.path)) + b"\0")
            elif entry.is_dir(follow_symlinks=False):
                h.update(b"d\0" + name + b"\0")
                _walk(h, entry.path, name)
            elif entry.is_file(follow_symlinks=False):
                h.update(b"f\0" + name + b"\0" + _file_digest(entry.path))
            else:
                h.update(b"o\0" + name + b"\0")
        except OSError as exc:
            h.update(b"!" + name + b"\0" + str(exc.strerror).encode() + b"\0")


def _file_digest(path: str) -> bytes:
    from dispatch.core.fingerprint import sha256

    h = sha256()
    try:
        with open(path, "rb") as fh:
            while True:
                chunk = fh.read(CHUNK)
                if not chunk:
                    break
                h.update(chunk)
    except OSError as exc:
        return b"!" + str(exc.strerror).encode()
    return bytes(h.digest())


def _admission(condition: Condition, inputs: dict[str, str], record: dict[str, Any] | None) -> Check:
    if record is None:
        return Check(condition, True, "no successful run recorded yet")
    recorded = record.get("inputs") or {}
    changed = [name for name, digest in inputs.items() if recorded.get(name) != digest]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record.get("time") or 0)))
    if changed:
        return Check(condition, True, f"changed since the last successful run at {when}: "
                                      f"{', '.join(changed)}")
    return Check(condition, False, f"unchanged since the last successful run at {when}")


def _state_path(state: str, script: Script, suffix: str, with_args: bool = True) -> str:
    """One file per script (and, for the record, its arguments) and host, named by a hash."""
    from dispatch.core.fingerprint import short_hash

    key = "\0".join([os.uname().nodename, script.real, *(script.args if with_args else ())])
    return os.path.join(state, f"{short_hash(key.encode('utf-8', 'surrogateescape'), 32)}{suffix}")


def _load_record(state: str, script: Script) -> dict[str, Any] | None:
    import json

    try:
        with open(_state_path(state, script, ".json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # unreadable or torn: as if never run, so the script runs
    return data if isinstance(data, dict) else None


def _ensure_private_dir(path: str) -> None:
    """Created 0700 and checked; another user's directory is refused, never reused (trust.md)."""
    from dispatch.guards.trust import private_dir

    private_dir(path, fix="set state_dir to a directory of your own")


# -------------------------------------------------------------------------- single-instance: lock
def _lock(state: str, script: Script, hold: bool) -> tuple[int | None, str]:
    """(fd holding the lock, detail), or (None, who holds it). Without ``hold`` (a dry run) the
    holder's record is left alone: the caller lets go at once."""
    from dispatch.core.flocking import flock_by

    path = _state_path(state, script, ".lock", with_args=False)
    try:
        _ensure_private_dir(state)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return None, f"cannot open the lock file {path}: {exc.strerror}"
    try:
        locked = flock_by(fd, time.monotonic() + LOCK_PATIENCE, step=0.02)
    except BaseException:
        os.close(fd)
        raise
    if not locked:
        holder = _holder(fd)
        os.close(fd)
        return None, holder
    if not hold:
        return fd, "no other instance running"
    from dispatch.core.procinfo import start_time

    me = os.getpid()
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{me} {start_time(me) or 0} {time.time():.0f} {script.path}\n".encode(
        "utf-8", "surrogateescape"), 0)
    return fd, "no other instance running"


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote there; ``held by this run`` for an ancestor (the
    script calling ``hostrun preflight "$0"`` under the hostrun that holds it for it)."""
    try:
        pid_s, start_s, since_s, command = os.pread(fd, 4096, 0).decode(errors="replace") \
            .rstrip("\n").split(" ", 3)
        pid, start, since = int(pid_s), int(start_s), float(since_s)
    except (OSError, ValueError):
        return "another instance is running"
    when = time.strftime("%H:%M:%S", time.localtime(since))
    if (pid, start) in _ancestors():
        return f"held by this run's own hostrun (pid {pid}, since {when})"
    return f"another instance is running: hostrun pid {pid} since {when}: {command}"


def _ancestors() -> set[tuple[int, int]]:
    """(pid, start time) of this process's ancestors."""
    found: set[tuple[int, int]] = set()
    pid = os.getppid()
    while pid > 1 and len(found) < 256:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                rest = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            break
        found.add((pid, int(rest[19])))
        pid = int(rest[1])
    return found
