"""Facts read from a Slurm cluster: for each, the command that prints it and a pure parser of its output.

Controller side, standard library only. Each fact is a ``*_command`` (the argv, run by whoever reaches
the cluster: locally or over the SSH transport to a login node) and a ``parse_*`` that takes the text
printed and returns small records, so the parsers are tested on outputs recorded from a real Slurm
(tests/recorded/slurm) without one. Sizes are bytes: Slurm prints memory as plain numbers in MiB
(``RealMemory=21695``) or with a binary suffix (``50M``, ``15G``, ``1234K``).
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}

# squeue's fixed output: job id, state (long form), reason, minimum memory, node list; "|"-separated.
SQUEUE_FORMAT = "%i|%T|%r|%m|%N"
# The report's: the same, then submit time, start time, partition and the job's name (last: a name
# may hold "|").
NAMED_FORMAT = SQUEUE_FORMAT + "|%V|%S|%P|%j"
# sacct's fields, in this order, -P (parsable, "|") and -n (no header).
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "MaxRSS", "ReqMem")
# What sacct prints (on stderr, status 1) on a cluster without accounting storage (no slurmdbd).
SACCT_DISABLED = "Slurm accounting storage is disabled"


class SlurmNode(NamedTuple):
    """One node from ``scontrol show node -o``; memory in bytes, ``gres`` as printed (None: none)."""

    name: str
    state: str  # e.g. IDLE, MIXED, ALLOCATED, IDLE+DRAIN, DOWN+NOT_RESPONDING
    real_memory: int
    alloc_memory: int
    free_memory: int | None  # None where the node has not reported it (N/A)
    cpus: int
    cpus_alloc: int
    gres: str | None
    reason: str | None  # why the node is down/drained, as set by the admin or Slurm
    partitions: tuple[str, ...] = ()
    gpus: int = 0  # GPUs in its Gres (``gpu:a100:4`` -> 4)
    gpus_used: int | None = None  # from GresUsed (``scontrol -d``); None where not printed

    @property
    def base_state(self) -> str:
        """The state without its flags (``MIXED+DRAIN`` -> ``MIXED``)."""
        return self.state.split("+")[0]

    @property
    def usable(self) -> bool:
        """Whether the node takes new jobs (not down, drained, draining or failing)."""
        flags = set(self.state.split("+"))
        return not flags & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING",
                            "POWERED_DOWN", "POWERING_DOWN", "FUTURE"}


class QueuedJob(NamedTuple):
    """One line of ``squeue`` in :data:`SQUEUE_FORMAT`; ``memory`` in bytes (0: the whole node)."""

    job_id: str
    state: str
    reason: str | None  # None where squeue prints "None"
    memory: int | None
    nodes: str | None  # None while pending
    # NAMED_FORMAT only (None from SQUEUE_FORMAT): when submitted and started (epoch seconds; a
    # pending job's start is None), its partition and name (hostrun's job name is the label).
    submitted: float | None = None
    started: float | None = None
    partition: str | None = None
    name: str | None = None


class DefaultMem(NamedTuple):
    """The ``--mem`` a job gets without one (``scontrol show config``): per node or per CPU, bytes;
    both None: a job without ``--mem`` gets the whole node's memory."""

    per_node: int | None
    per_cpu: int | None


class JobRecord(NamedTuple):
    """``scontrol show job -o ID``: what a job ended (or is) as, while slurmctld still keeps it."""

    job_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, OUT_OF_MEMORY, TIMEOUT, NODE_FAIL, CANCELLED, ...
    reason: str | None
    exit_code: int  # the job's exit status (the first half of ExitCode=N:S)
    exit_signal: int  # the signal that ended it, 0 if none (the second half)
    memory: int | None  # MinMemoryNode (or MinMemoryCPU times CPUs), bytes
    nodes: str | None
    run_time: float | None = None  # seconds it ran (RunTime), None where not printed


class StepAccounting(NamedTuple):
    """One line of ``sacct -P -n``: a job or one of its steps (``12``, ``12.batch``, ``12.0``)."""

    job_id: str
    name: str
    state: str  # the first word: "CANCELLED by 0" -> CANCELLED
    exit_code: int
    exit_signal: int
    max_rss: int | None  # bytes; None where not measured (the job line itself, or no gathering)
    req_mem: int | None


def to_bytes(text: str, unit: str = "M") -> int | None:
    """A Slurm size in bytes: ``50M``, ``15G``, ``1234K``, or a plain number in ``unit`` (MiB by default).

    Empty, ``N/A`` and ``(null)`` give None. ReqMem's old per-CPU/per-node tags (``4000Mc``/``Mn``) drop.
    """
    text = text.strip()
    if text and text[-1] in "cn" and len(text) > 1 and text[-2].upper() in _UNITS:
        text = text[:-1]
    if not text or text in ("N/A", "(null)", "Unknown"):
        return None
    suffix = text[-1].upper()
    if suffix in _UNITS:
        number, scale = text[:-1], _UNITS[suffix]
    else:
        number, scale = text, _UNITS[unit]
    try:
        return int(float(number) * scale)
    except ValueError:
        raise ValueError(f"not a Slurm size: {text!r}") from None


def parse_key_values(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol ... -o`` line.

    Values may hold spaces (``OS=Linux 6.1 #1 SMP``, ``Reason=disk check [root@...]``): a word without
    ``=`` continues the value before it. (A value word holding ``=`` would start a key: scontrol prints
    no such field we read.)
    """
    pairs: dict[str, str] = {}
    key = None
    for word in line.split():
        name, eq, value = word.partition("=")
        if eq and name:
            key = name
            pairs[key] = value
        elif key is not None:
            pairs[key] = (pairs[key] + " " + word).strip()
    return pairs


def _opt(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "None", "N/A") else value


def _exit(value: str) -> tuple[int, int]:
    code, _, sig = value.partition(":")
    return int(code or 0), int(sig or 0)


def duration_seconds(text: str) -> float | None:
    """A Slurm duration in seconds: ``[D-]HH:MM:SS``, ``MM:SS`` (None: empty, UNLIMITED, unreadable)."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not clock or not all(p.isdigit() for p in parts) or len(parts) > 3 or (days and not days.isdigit()):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return float(seconds + int(days or 0) * 86400)


def node_command() -> list[str]:
    """Every node, one line each."""
    return ["scontrol", "show", "node", "-o"]


def parse_nodes(text: str) -> list[SlurmNode]:
    """The nodes of ``scontrol show node -o`` (blank lines and "No nodes" skipped)."""
    nodes = []
    for line in text.splitlines():
        kv = parse_key_values(line)
        if "NodeName" not in kv:
            continue
        nodes.append(SlurmNode(
            name=kv["NodeName"], state=kv.get("State", "UNKNOWN"),
            real_memory=to_bytes(kv.get("RealMemory", "0")) or 0,
            alloc_memory=to_bytes(kv.get("AllocMem", "0")) or 0,
            free_memory=to_bytes(kv.get("FreeMem", "")),
            cpus=int(kv.get("CPUTot", "0")), cpus_alloc=int(kv.get("CPUAlloc", "0")),
            gres=_opt(kv.get("Gres")), reason=_opt(kv.get("Reason")),
            partitions=tuple(p for p in (_opt(kv.get("Partitions")) or "").split(",") if p),
            gpus=gpu_count(kv.get("Gres") or ""),
            gpus_used=gpu_count(kv["GresUsed"]) if "GresUsed" in kv else None,
        ))
    return nodes


def node_details_command() -> list[str]:
    """:func:`node_command` with details: also ``GresUsed`` (the GPUs allocated), for the report."""
    return ["scontrol", "-d", "show", "node", "-o"]


def gpu_count(gres: str) -> int:
    """The GPUs in a Gres string: ``gpu:a100:4(S:0-1),gpu:v100:2,mps:100`` -> 6; ``gpu`` alone is one;
    ``(null)`` none. Also reads GresUsed (``gpu:a100:1(IDX:0)``)."""
    total, depth, item = 0, 0, ""
    for ch in gres + ",":
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts = item.split("(")[0].split(":")
            if parts[0] == "gpu":
                total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
            item = ""
        else:
            item += ch
    return total


def queue_command(user: str | None = None, named: bool = False) -> list[str]:
    """The queue (all users, or ``user``'s), without header, in :data:`SQUEUE_FORMAT` (``named``:
    :data:`NAMED_FORMAT`)."""
    argv = ["squeue", "--noheader", "--format", NAMED_FORMAT if named else SQUEUE_FORMAT]
    return argv + (["--user", user] if user else [])


def parse_queue(text: str) -> list[QueuedJob]:
    """The jobs of ``squeue`` in :data:`SQUEUE_FORMAT` or :data:`NAMED_FORMAT`."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", 8)
        if len(fields) not in (5, 9):
            raise ValueError(f"squeue line has {len(fields)} fields, not 5 or 9: {line!r}")
        job_id, state, reason, memory, nodes = fields[:5]
        job = QueuedJob(job_id, state, _opt(reason), to_bytes(memory), _opt(nodes))
        if len(fields) == 9:
            submitted, started, partition, name = fields[5:]
            job = job._replace(submitted=_when(submitted), started=_when(started),
                               partition=_opt(partition), name=name)
        jobs.append(job)
    return jobs


def _when(text: str) -> float | None:
    """A Slurm time (``2026-11-30T19:02:35``, this machine's local time) in epoch seconds; None for
    ``N/A``, ``Unknown``, ``None``."""
    import time

    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def config_command() -> list[str]:
    """The controller's configuration, ``Key = Value`` per line."""
    return ["scontrol", "show", "config"]


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` as a dict (lines without `` = `` skipped)."""
    pairs = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() and " " not in key.strip():
            pairs[key.strip()] = value.strip()
    return pairs


def default_mem(config: dict[str, str]) -> DefaultMem:
    """The cluster's own default ``--mem`` from :func:`parse_config` (``UNLIMITED``: not set)."""
    def size(key: str) -> int | None:
        value = config.get(key, "")
        return None if value in ("", "UNLIMITED", "0") else to_bytes(value)

    return DefaultMem(size("DefMemPerNode"), size("DefMemPerCPU"))


def version_command() -> list[str]:
    return ["scontrol", "--version"]


def parse_version(text: str) -> str | None:
    """``slurm-wlm 22.05.8`` (or ``slurm 23.11.1``) -> ``22.05.8``."""
    words = text.split()
    return words[-1] if words else None


def job_command(job_id: str) -> list[str]:
    """One job's record (kept by slurmctld for ``MinJobAge`` seconds after it ends)."""
    return ["scontrol", "show", "job", "-o", job_id]


def parse_job(text: str) -> JobRecord | None:
    """The job of ``scontrol show job -o ID`` (None: not found, e.g. "Invalid job id specified")."""
    for line in text.splitlines():
        kv = parse_key_values(line)
        if "JobId" not in kv:
            continue
        code, sig = _exit(kv.get("ExitCode", "0:0"))
        memory = to_bytes(kv.get("MinMemoryNode", ""))
        if memory is None and "MinMemoryCPU" in kv:
            per_cpu = to_bytes(kv["MinMemoryCPU"])
            memory = None if per_cpu is None else per_cpu * int(kv.get("NumCPUs", "1"))
        return JobRecord(kv["JobId"], kv.get("JobName", ""), kv.get("JobState", "UNKNOWN"),
                         _opt(kv.get("Reason")), code, sig, memory, _opt(kv.get("NodeList")),
                         duration_seconds(kv.get("RunTime", "")))
    return None


def accounting_command(job_id: str) -> list[str]:
    """A job's accounting lines (the job, then each step), or :data:`SACCT_DISABLED` without slurmdbd."""
    return ["sacct", "-P", "-n", "--format=" + ",".join(SACCT_FIELDS), "-j", job_id]


def accounting_disabled(stderr: str) -> bool:
    """Whether sacct refused because the cluster keeps no accounting (read ``scontrol`` instead)."""
    return SACCT_DISABLED in stderr


def parse_accounting(text: str) -> list[StepAccounting]:
    """The lines of ``sacct -P -n`` with :data:`SACCT_FIELDS`."""
    steps = []
    for fields in _rows(text, len(SACCT_FIELDS), "sacct"):
        job_id, name, state, exit_code, max_rss, req_mem = fields
        code, sig = _exit(exit_code)
        steps.append(StepAccounting(job_id, name, state.split()[0] if state.strip() else "", code, sig,
                                    to_bytes(max_rss, unit="K"), to_bytes(req_mem)))
    return steps


def _rows(text: str, count: int, what: str) -> list[list[str]]:
    """The ``|``-separated fields of each non-blank line; ValueError when a line has not ``count``."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != count:
            raise ValueError(f"{what} line has {len(fields)} fields, not {count}: {line!r}")
        rows.append(fields)
    return rows
