"""The workspace lock: one holder at a time of a directory (``hostrun lock [--wait DUR] DIR -- CMD``).

Two layers, which must agree before anyone takes the lock:

- an OS lock, ``fcntl.flock`` on a lock file, held by the ``hostrun lock`` process for as long as its
  command runs. The kernel drops it when that process ends however it ends (SIGKILL included), so a
  crashed holder can never keep the lock. The descriptor is close-on-exec: the command does not
  inherit it, so the lock is never held by an orphan;
- a record next to it (``<lock file>.json``): who holds it (pid, start time = field 22 of
  ``/proc/PID/stat``, session, command, since, host, boot id, and the command's own pid). It is for
  people and for ``--status``, and it decides what a free flock means: no record, or a record whose
  holder is gone (pid gone, or its start time differs: the pid was reused) → take the lock, and
  say so when a record was left behind; a record whose holder still runs although the flock is free
  (someone deleted the lock file under it) → wait for it, as if it held the flock.

The files live in DIR itself, so that every user and session that works in DIR sees the same lock:
``DIR/.git/hostrun-lock`` when DIR is a git checkout (``.git`` is a directory: nothing shows in ``git
status``), else ``DIR/.hostrun-lock``. The lock file is never removed; the record is replaced
atomically and removed by the holder before it unlocks.

DIR is meant to be written by several users, so any of them may plant something at those names (a
symlink to ``/etc/shadow``, a FIFO, a file of their own). The directory holding the files is opened
once and every name is reached through that descriptor (a ``.git`` swapped for a symlink later
redirects nothing); each file is opened with ``O_NOFOLLOW|O_NONBLOCK`` and used only when it is a
regular file; the lock file's mode is set only when this call created it (``O_CREAT|O_EXCL``); the
record is read bounded in size and written through ``core.atomicfile`` (an unguessable temporary
name, created exclusively). The lock file is opened read-only: ``flock`` needs no more.

``hostrun lock`` is not the memory-capped runner: for both, nest them, ``hostrun lock DIR -- hostrun
-m 4G -- make``. A ``hostrun lock DIR`` inside a command that already holds DIR's lock (the holder is
an ancestor process) runs its command inside that lock instead of waiting for itself forever.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence

from dispatch.core.atomicfile import write_atomic
from dispatch.core.errors import LockTimeoutError, UsageError
from dispatch.core.exitcodes import from_wait_status
from dispatch.core.flocking import try_flock
from dispatch.core.procinfo import CannotTell, cmdline, is_alive, parent_of, start_time
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Any, Optional

LOCK_NAME = ".hostrun-lock"  # in DIR
GIT_LOCK_NAME = "hostrun-lock"  # in DIR/.git
POLL = 0.1  # seconds between tries while waiting: a released lock is taken within this
UNRECORDED_GRACE = 1.0  # a flock held with no record yet (a holder that just took it) is not news
MAX_RECORD = 64 << 10  # a record is a few hundred bytes; a neighbour's huge file is not read whole
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec, so restore them.
_CHILD_DEFAULTS = (*FORWARDED, signal.SIGQUIT,
                   *(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, n)))


class LockPaths(NamedTuple):
    dir: str  # DIR's real path
    lock: str  # the flock file
    record: str  # the holder record (JSON)


class Holder(NamedTuple):
    """The record of who holds (or held) the lock."""

    pid: int
    start: int
    session: str
    command: str
    since: float
    host: str = ""
    boot_id: str = ""
    dir: str = ""
    child: int = 0  # the command's pid, once started
    child_start: int = 0

    def line(self, directory: str | None = None) -> str:
        """``session S, pid P holds DIR since T: CMD``, the line a waiter prints."""
        return (f"session {self.session}, pid {self.pid} holds {directory or self.dir} since "
                f"{clock(self.since)}: {self.command}")

    def gone(self) -> str | None:
        """Why the process this record names no longer holds anything, or None while it runs."""
        if self.host and self.host != socket.gethostname():
            return f"it was recorded on host {self.host}, where this host cannot see its processes"
        if self.boot_id and self.boot_id != boot_id():
            return "it was recorded before this host last booted"
        try:
            now = start_time(self.pid) if self.pid > 0 else None
        except CannotTell:  # an fd limit or EACCES is not proof the holder is gone: it holds
            return None
        if now is None:
            return f"pid {self.pid} is gone"
        if now != self.start:
            return (f"pid {self.pid} now belongs to another process (start time {now}, "
                    f"recorded {self.start})")
        if not is_alive(self.pid, self.start):
            return f"pid {self.pid} has exited"
        return None

    def child_running(self) -> bool:
        return self.child > 0 and is_alive(self.child, self.child_start)

    def as_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["since_text"] = clock(self.since)
        return data


def clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def default_session(environ: Mapping[str, str] | None = None) -> str:
    """``$HOSTRUN_SESSION``, else the parent process: ``pid 1234 (bash -c make)``."""
    env = os.environ if environ is None else environ
    named = env.get("HOSTRUN_SESSION")
    if named:
        return named
    parent = os.getppid()
    command = cmdline(parent)
    if len(command) > 60:
        command = command[:57] + "..."
    return f"pid {parent} ({command or '?'})"


def lock_paths(directory: str) -> LockPaths:
    real = os.path.realpath(directory)
    if not os.path.isdir(real):
        raise UsageError(f"{directory}: not a directory")
    git = os.path.join(real, ".git")
    if os.path.isdir(git) and not os.path.islink(git):
        lock = os.path.join(git, GIT_LOCK_NAME)
    else:
        lock = os.path.join(real, LOCK_NAME)
    return LockPaths(real, lock, lock + ".json")


def open_lock_dir(paths: LockPaths) -> int:
    """The directory the lock files live in, opened once: every later name is looked up in it, so a
    component swapped for a symlink afterwards (``.git`` pointed at ``/etc``) redirects nothing."""
    try:
        fd = os.open(paths.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot open {paths.dir}: {exc.strerror}") from None
    if os.path.dirname(paths.lock) == paths.dir:
        return fd
    try:
        return os.open(".git", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError as exc:
        raise UsageError(f"refusing {paths.dir}/.git for the lock: {_open_problem(exc)}; "
                         "nothing ran") from None
    finally:
        os.close(fd)


def _open_problem(exc: OSError) -> str:
    import errno

    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "it is a symbolic link or not a directory (someone else may have planted it)"
    return exc.strerror or str(exc)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or other special file"


def read_record(path: str, dir_fd: int | None = None) -> Holder | None:
    """The record, or None when there is none (or it cannot be read: then it names nobody). A
    symlink, FIFO or anything but a regular file at its name names nobody either, and is never
    followed or waited on; only its first ``MAX_RECORD`` bytes are read."""
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, MAX_RECORD))
        fields = {k: data[k] for k in Holder._fields if k in data}
        return Holder(**fields)
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None
    finally:
        os.close(fd)


def write_record(path: str, holder: Holder, dir_fd: int | None = None) -> None:
    """Replace the record atomically (readers never see half of one); readable by everyone."""
    write_atomic(path, (json.dumps(holder._asdict(), sort_keys=True) + "\n").encode(), 0o644,
                 exact_mode=True, dir_fd=dir_fd)


def _remove_record_if_ours(dir_fd: int, name: str, me: Holder) -> None:
    current = read_record(name, dir_fd)
    if current is not None and (current.pid, current.start) == (me.pid, me.start):
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass


def _open_lock_file(dir_fd: int, path: str) -> int:
    """The lock file, created (mode 0644, so that every user of DIR can open it to lock) or opened
    as it is. Refused, nothing changed, when its name holds anything but a regular file."""
    name = os.path.basename(path)
    try:
        fd = os.open(name, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        created = True
    except FileExistsError:
        created = False
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise UsageError(f"refusing the lock file {path}: {_open_problem(exc)}; nothing ran; "
                             "remove it if it is not a plain file") from None
    except OSError as exc:
        raise UsageError(f"cannot create the lock file {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"refusing the lock file {path}: it is {_kind(mode)}, not a regular file; "
                             "nothing ran; remove it")
        if created:  # the umask may have left it unreadable to the other users of DIR
            os.fchmod(fd, 0o644)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same_file(fd: int, dir_fd: int, path: str) -> bool:
    """The locked descriptor is still the file at ``path`` (nobody replaced or removed it)."""
    try:
        a, b = os.fstat(fd), os.stat(os.path.basename(path), dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def flock_held(path: str, dir_fd: int | None = None) -> bool:
    """Whether some process holds the flock on ``path`` now (a missing file, or anything but a
    regular file: nobody)."""
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and not try_flock(fd, shared=True)
    finally:
        os.close(fd)  # also releases the shared lock just taken


def _ancestors() -> set[tuple[int, int]]:
    """(pid, start time) of every ancestor of this process."""
    found: set[tuple[int, int]] = set()
    pid = os.getppid()
    while pid > 1 and len(found) < 512:
        try:
            started = start_time(pid)
        except CannotTell:
            break
        if started is None:
            break
        found.add((pid, started))
        parent = parent_of(pid)
        if parent is None:
            break
        pid = parent
    return found


def acquire(paths: LockPaths, me: Holder, say: Callable[[str], None], interval: float,
            wait: float | None = None, *, dir_fd: int) -> int | None:
    """Take the lock: the flock's descriptor, or None when an ancestor already holds it (nested).
    ``dir_fd`` is ``open_lock_dir(paths)``.

    Waits while another holder runs, saying who every ``interval`` seconds; raises
    ``LockTimeoutError`` once ``wait`` seconds have passed.
    """
    record = os.path.basename(paths.record)
    began = time.monotonic()
    deadline = None if wait is None else began + wait
    next_line = began
    ancestors: set[tuple[int, int]] | None = None
    while True:
        fd = _open_lock_file(dir_fd, paths.lock)
        blocker: Holder | None = None
        if not try_flock(fd):
            os.close(fd)
            blocker = read_record(record, dir_fd)
        else:
            if not _same_file(fd, dir_fd, paths.lock):
                os.close(fd)  # the file was replaced while we locked it: lock the new one
                continue
            try:
                prior = read_record(record, dir_fd)
                why = prior.gone() if prior is not None else None
                if prior is None or why is not None:
                    if prior is not None:
                        say(f"took over {paths.dir}: the recorded holder is gone ({why}): "
                            f"{prior.line(paths.dir)}")
                        if prior.child_running():
                            say(f"warning: its command, pid {prior.child}, is still running "
                                f"({cmdline(prior.child) or prior.command})")
                    try:
                        write_record(record, me, dir_fd)
                    except OSError as exc:  # the flock is the lock; the record only says who
                        say(f"warning: cannot write the lock record {paths.record}: {exc.strerror}; "
                            "holding the lock without it")
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the flock is free but the recorded holder runs: respect the record
            blocker = prior
        now = time.monotonic()
        if blocker is not None and blocker.gone() is None:
            if ancestors is None:
                ancestors = _ancestors()
            if (blocker.pid, blocker.start) in ancestors:
                say(f"{paths.dir} is held by an enclosing 'hostrun lock' (pid {blocker.pid}); "
                    "running inside it")
                return None
        shown = blocker.line(paths.dir) if blocker is not None else \
            f"{paths.dir} is locked by a holder that has not written its record ({paths.record})"
        if deadline is not None and now >= deadline:
            raise LockTimeoutError(f"gave up after waiting {wait:g} s (--wait) for {paths.dir}: "
                                   f"{shown}; the command did not run")
        if now >= next_line and (blocker is not None or now - began >= UNRECORDED_GRACE):
            say(f"waiting: {shown}" if blocker is None else shown)
            next_line = now + interval
        pause = POLL if deadline is None else max(0.0, min(POLL, deadline - now))
        time.sleep(pause)


def release(paths: LockPaths, me: Holder, fd: int, *, dir_fd: int) -> None:
    """Remove our record, then drop the flock (in that order: a waiter never sees our record
    with a free flock)."""
    try:
        _remove_record_if_ours(dir_fd, os.path.basename(paths.record), me)
    finally:
        os.close(fd)


def run_child(argv: Sequence[str], on_start: Callable[[int], None] | None = None,
              say: Callable[[str], None] | None = None) -> int:
    """Run ``argv`` as a child and return its exit status (128+N when signal N killed it).

    SIGINT, SIGTERM and SIGHUP sent to this process (``kill``) are forwarded to the command. Ones
    the kernel generated for the whole foreground process group (Ctrl-C at a terminal, a hangup)
    reached the command directly, as a member of that group, and are not sent a second time.
    """
    watched = {*FORWARDED, signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        try:
            pid = os.posix_spawnp(argv[0], list(argv), dict(os.environ), setsigmask=(),
                                  setsigdef=_CHILD_DEFAULTS)
        except (OSError, ValueError) as exc:  # ValueError: an empty command name
            from dispatch.core.exitcodes import exec_failure

            code, reason = exec_failure(exc)
            if say is not None:
                say(f"cannot run {argv[0]!r}: {reason}")
            return code
        if on_start is not None:
            try:
                on_start(pid)
            except OSError:
                pass  # the record is for people; the lock itself is the flock
        while True:
            info = signal.sigtimedwait(watched, 1.0)
            if info is not None and info.si_signo != signal.SIGCHLD and info.si_code <= 0:
                try:  # si_code <= 0: sent by a process (kill, sigqueue), not by the terminal
                    os.kill(pid, info.si_signo)
                except ProcessLookupError:
                    pass
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped == pid:
                break
        while signal.sigtimedwait(watched, 0) is not None:
            pass  # drop what arrived meanwhile: it was the command's to act on, and it has ended
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return from_wait_status(status)[0]


def run_locked(directory: str, argv: Sequence[str], say: Callable[[str], None], interval: float,
               wait: float | None = None, session: str | None = None) -> int:
    """``hostrun lock``: take DIR's lock, run the command, pass its exit status through, release."""
    import shlex

    if not argv:
        raise UsageError("no command given (usage: hostrun lock [--wait DUR] DIR -- CMD [ARGS...])")
    paths = lock_paths(directory)
    me_pid = os.getpid()
    me = Holder(pid=me_pid, start=start_time(me_pid) or 0, session=session or default_session(),
                command=shlex.join(argv), since=time.time(), host=socket.gethostname(),
                boot_id=boot_id(), dir=paths.dir)
    where = open_lock_dir(paths)
    try:
        fd = acquire(paths, me, say, interval, wait, dir_fd=where)
        if fd is None:  # nested inside a holder: already ours
            return run_child(argv, say=say)
        try:
            record = os.path.basename(paths.record)

            def started(pid: int) -> None:
                write_record(record, me._replace(child=pid, child_start=start_time(pid) or 0), where)

            return run_child(argv, on_start=started, say=say)
        finally:
            release(paths, me, fd, dir_fd=where)
    finally:
        os.close(where)


def status(directory: str) -> dict[str, Any]:
    """Who holds DIR's lock now: ``state`` is ``free``, ``held`` or ``stale`` (free, with a record
    left by a holder that is gone: the next taker takes over)."""
    paths = lock_paths(directory)
    where = open_lock_dir(paths)
    try:
        held = flock_held(os.path.basename(paths.lock), where)
        record = read_record(os.path.basename(paths.record), where)
    finally:
        os.close(where)
    why = record.gone() if record is not None else None
    if held or (record is not None and why is None):
        state = "held"
    elif record is not None:
        state = "stale"
    else:
        state = "free"
    return {
        "dir": paths.dir, "lock_file": paths.lock, "record_file": paths.record, "state": state,
        "flock_held": held, "holder": record.as_dict() if record is not None else None,
        "holder_gone": why, "command_running": record.child_running() if record is not None else None,
    }


def status_lines(data: dict[str, Any]) -> list[str]:
    """The human form of ``status``."""
    holder: Optional[dict[str, Any]] = data["holder"]
    if data["state"] == "free":
        return [f"{data['dir']} is free"]
    if holder is None:
        return [f"{data['dir']} is locked, but its holder has not written a record ({data['record_file']})"]
    record = Holder(**{k: holder[k] for k in Holder._fields})
    if data["state"] == "held":
        lines = [record.line(data["dir"])]
        if record.child:
            lines.append(f"  its command runs as pid {record.child}")
        if data["holder_gone"]:
            lines.append(f"  (the record is from a holder that is gone: {data['holder_gone']}; the "
                         "lock itself is held by another process)")
        return lines
    lines = [f"{data['dir']} is free; a stale record is left ({data['holder_gone']}): "
             f"{record.line(data['dir'])}", "  the next 'hostrun lock' takes over"]
    if data["command_running"]:
        lines.append(f"  warning: that holder's command, pid {record.child}, is still running")
    return lines
