"""What a run asks for, and whether this process already runs inside a hostrun job.

Kept apart from ``dispatch.local.run.runner`` so that the paths that do not run a job here (``--peer``,
``--auto``'s decision, a nested call) do not import the runner's machinery (ledger, cgroups, ...).
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Mapping, Sequence
    from typing import Optional

JOB_ENV = "HOSTRUN_JOB"  # set in every job: the job's cgroup, so a nested hostrun can tell
# Set in an agent session (``hostrun session``): its cgroup. The session's own hostrun runs are jobs
# of their own (booked, in the jobs' part of the slice), not nested in the session.
SESSION_ENV = "HOSTRUN_SESSION_CGROUP"
THREAD_KNOBS = ("CARGO_BUILD_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL")


def default_label(argv: Sequence[str]) -> str:
    """A stable fingerprint of the command: readable program name plus a hash of the whole argv
    (bytes that are not UTF-8 in the name are written ``\\xNN``: the label is stored as text)."""
    import os

    from dispatch.core.fingerprint import short_hash
    from dispatch.core.text import storable

    digest = short_hash("\0".join(argv).encode("utf-8", "surrogateescape"))
    return f"{storable(os.path.basename(argv[0])) or 'job'}-{digest}"


class RunRequest(NamedTuple):
    argv: Sequence[str]
    label: Optional[str] = None
    cap: Optional[int] = None
    max_runtime: Optional[float] = None
    threads: Optional[int] = None
    no_cap: bool = False
    session: Optional[str] = None
    env: Optional[dict[str, str]] = None  # the job's environment (default: hostrun's own)
    gpu_memory: Optional[int] = None  # VRAM to book on one GPU (--gpu-memory), bytes
    force: bool = False  # --force: run although the script's '# admission:' says nothing changed
    group: Optional[str] = None  # --group: the group's max_running caps it
    when_idle: bool = False  # --when-idle: only while no other hostrun job runs here
    requeue: bool = False  # --requeue: killed because the slice filled (254), it runs again at its cap
    role: str = "job"  # "session": an agent session (``hostrun session``), in the sessions slice



def enclosing_job(environ: Mapping[str, str]) -> str | None:
    """The hostrun job this process runs inside, if any (its cgroup path), else None.

    ``HOSTRUN_JOB`` alone could have leaked into an unrelated process's environment, so it counts
    only while this process really is in that job's cgroup.
    """
    path = environ.get(JOB_ENV)
    if not path:
        return None
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    job = path.rstrip("/")
    for line in lines:
        own = line.split(":", 2)[-1].rstrip("/")
        if own and (job == own or job.endswith("/" + own.lstrip("/"))):
            return path
    return None


def job_environment(base: dict[str, str], threads: int, forced: bool) -> dict[str, str]:
    """The heavy-thread default: set unless already set, or always when ``--threads`` was given."""
    env = dict(base)
    wanted = {"HOSTRUN_THREADS": str(threads), "MAKEFLAGS": f"-j{threads}"}
    wanted.update({knob: str(threads) for knob in THREAD_KNOBS})
    for key, value in wanted.items():
        if forced or key not in env:
            env[key] = value
    return env
