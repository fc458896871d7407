"""Fork the job's process early, let it enter its cgroup, and exec it only once it is admitted.

Entering a memory cgroup through ``cgroup.procs`` costs 5-20 ms on these machines (the write waits
for an RCU grace period; cgroup v1's child enters through ``tasks`` instead, in 0.15 ms:
``Cgroup1Job.preexec``). Forking first lets that happen while hostrun opens the ledger and asks for
admission, instead of after. Until told to go, the child only waits on a
pipe; if hostrun dies or gives up, the pipe closes and the child exits without running anything.

The job inherits hostrun's inheritable file descriptors (like ``env`` or ``nice`` would, so a make
jobserver keeps working); hostrun's own descriptors are close-on-exec. With ``outputs`` (a
``--gpu-memory`` job, whose output hostrun scans) its stdout and stderr are those two pipe ends
instead. ``go`` may add environment variables decided only at admission (``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import os

from dispatch.capping.base import JobCgroup
from dispatch.core.errors import NotRunError
from dispatch.core.exitcodes import NOT_FOUND, exec_failure

MYPY = False
if MYPY:
    import signal
    from collections.abc import Sequence
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal

# Python ignores SIGPIPE (and SIGXFSZ); an ignored signal stays ignored across exec, so restore them.
_RESTORE = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(signal, name))
CGROUP_FAILED = -1
_DEFAULTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, *_RESTORE)


def _exec_searching_path(argv: list[str], env: dict[str, str]) -> None:
    """``os.execvpe`` without its cost: the parent waits for this exec, and ``os.get_exec_path``
    imports ``warnings`` (~1.5 ms) in the child first. The same search: a name with a slash is run as
    is; else each entry of the job's ``PATH`` (``os.defpath`` when unset) in turn, and the first error
    that is not "no such file" is the one reported."""
    name = argv[0]
    if "/" in name:
        os.execve(name, argv, env)
    first_other: OSError | None = None
    last: OSError | None = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory, name), argv, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:
            last = exc
            first_other = first_other or exc
    raise first_other or last or FileNotFoundError(2, "No such file or directory", name)


class PreparedChild:
    def __init__(self, pid: int, go_fd: int, err_fd: int) -> None:
        self.pid = pid
        self._go_fd = go_fd
        self._err_fd = err_fd

    @classmethod
    def fork(cls, job: JobCgroup, argv: Sequence[str], env: dict[str, str],
             outputs: tuple[int, int] | None = None) -> PreparedChild:
        exec_argv = list(argv)
        opened: list[int] = []
        try:
            go_r, go_w = os.pipe()
            opened += (go_r, go_w)
            err_r, err_w = os.pipe()
            opened += (err_r, err_w)
            pid = os.fork()
        except OSError as exc:  # a pids or fd limit: say so (78) instead of a traceback
            for fd in opened:
                os.close(fd)
            step = "fork" if len(opened) == 4 else "pipe"
            raise NotRunError(f"cannot start the job ({step}: {exc.strerror or exc}): "
                              "a limit on processes or open files was reached; nothing ran") from exc
        if pid == 0:  # pragma: no cover - the child; exercised by every end-to-end test
            code = NOT_FOUND
            try:
                os.close(go_w)
                os.close(err_r)
                os.setpgid(0, 0)
                if outputs is not None:
                    os.dup2(outputs[0], 1)
                    os.dup2(outputs[1], 2)
                for sig in _DEFAULTS:
                    signal.signal(sig, signal.SIG_DFL)
                # hostrun holds these back from its admission until its handlers are in place:
                # the job gets them as any process does
                signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT))
                try:
                    job.preexec()
                except OSError as exc:
                    os.write(err_w, f"{CGROUP_FAILED} cannot enter {job.path}: {exc.strerror}".encode())
                    os._exit(code)
                order = b""
                while True:  # "go ADJ\n" then NAME=VALUE\0 items; EOF when hostrun closes its end
                    chunk = os.read(go_r, 4096)
                    if not chunk:
                        break
                    order += chunk
                if not order.startswith(b"go "):
                    os._exit(0)  # hostrun gave up or died: run nothing
                header, _, extra = order.partition(b"\n")
                adj = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                os.write(adj, header[3:].strip())
                os.close(adj)
                for item in extra.split(b"\0"):
                    name, eq, value = item.partition(b"=")
                    if eq:
                        env[name.decode(errors="surrogateescape")] = value.decode(errors="surrogateescape")
                _exec_searching_path(exec_argv, env)
            except (OSError, ValueError) as exc:  # ValueError: an empty command name
                code, reason = exec_failure(exc)
                os.write(err_w, f"{code} {reason}".encode())
            finally:
                os._exit(code)
        os.close(go_r)
        os.close(err_w)
        try:
            os.setpgid(pid, pid)  # also here, so it holds before either side goes on
        except OSError:
            pass
        child = cls(pid, go_w, err_r)
        try:
            job.adopt(pid)
        except BaseException:
            child.cancel()
            raise
        job.started(pid)
        return child

    def go(self, oom_score_adj: int, extra_env: dict[str, str] | None = None) -> tuple[int, str] | None:
        """Let the child exec; returns (exit code, reason) if it could not, else None.

        The code is 127/126 when the command could not be executed, ``CGROUP_FAILED`` when the child
        could not even enter the job's cgroup (it then ran nothing). ``extra_env`` is added to the
        job's environment (names and values without NUL bytes).
        """
        order = f"go {oom_score_adj}\n".encode()
        for name, value in (extra_env or {}).items():
            order += f"{name}={value}".encode(errors="surrogateescape") + b"\0"
        try:
            os.write(self._go_fd, order)
        except BrokenPipeError:
            pass  # the child already gave up; its reason is on the error pipe
        os.close(self._go_fd)
        self._go_fd = -1
        data = b""
        while True:
            chunk = os.read(self._err_fd, 512)  # EOF once exec succeeded (close-on-exec)
            if not chunk:
                break
            data += chunk
        os.close(self._err_fd)
        self._err_fd = -1
        if not data:
            return None
        code, _, reason = data.decode(errors="replace").partition(" ")
        os.waitpid(self.pid, 0)
        return int(code), reason

    def cancel(self) -> None:
        """Tell the waiting child to exit without running anything, and reap it."""
        for fd in (self._go_fd, self._err_fd):
            if fd >= 0:
                os.close(fd)
        self._go_fd = self._err_fd = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
