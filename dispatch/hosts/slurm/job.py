"""A hostrun job as a Slurm job, in pure functions: the ``srun`` command line, the small shell wrapper
that runs the job on the node, the filter that takes the wrapper's one line out of the job's stderr,
and how a job's end becomes hostrun's exit code (docs/slurm.md, "Mapping").

Why a wrapper: the job's peak is read on the node from the step's own memory cgroup (its high-water
mark: ``memory.max_usage_in_bytes`` on cgroup v1, ``memory.peak`` on v2), which is what ``--mem`` is
enforced against, less the page cache still charged when the job ends (shared memory kept), which is
what hostrun records on a machine of its own (``JobCgroup.peak_estimate``). ``sacct``'s ``MaxRSS`` needs
slurmdbd (small sites run without it) and is a sample taken every ``JobAcctGatherFrequency`` seconds
(30 s by default), which misses a short spike. The wrapper is POSIX ``sh`` (no Python needed on the
nodes), runs the job as its child with stdin, stdout and stderr untouched, and after it ends prints
one line to stderr: a random per-run marker, the job id, the peak. hostrun removes that line from the
stream and keeps everything else byte for byte.
"""

from __future__ import annotations

import os

from dispatch.core.exitcodes import SIGNAL_BASE, ExitCode
from dispatch.core.units import MiB
from dispatch.core.verdicts import Verdict

MYPY = False
if MYPY:

    from dispatch.core.request import RunRequest
    from dispatch.hosts.slurm.keys import SlurmOptions

COMMENT_PREFIX = "hostrun:"  # --comment=hostrun:TOKEN finds the job by its token (squeue %k)

# $0 is the job's own name; the marker is in the script. The job runs as the wrapper's child in the
# background, so that the wrapper can hand it the signals Slurm sends the task (``scancel --signal``
# reaches the task, this shell, alone): a foreground child would be waited for before any trap ran.
# A background child gets /dev/null as stdin and ignores SIGINT and SIGQUIT (POSIX, for a shell
# without job control): its stdin is given back explicitly (fd 3), and ``env --default-signal``
# (coreutils 8.31+) restores the two signals where it exists. ``wait`` returns early for a trapped
# signal, so the loop waits until the child itself has ended (its stderr silenced: dash says
# "Terminated" there for a child a signal killed, which is not the job's own output). A command the
# node cannot find is reported (``noexec``), for hostrun to say it as a local run does.
WRAPPER = r"""
CHDIR
command -v -- "$1" >/dev/null 2>&1 || { printf '%s%s:noexec\n' 'MARK' "$SLURM_JOB_ID" >&2; exit 127; }
t0=$(date +%s.%N 2>/dev/null)
exec 3<&0
if env --default-signal=INT true 2>/dev/null; then
  env --default-signal=INT,QUIT "$@" <&3 3<&- &
else
  "$@" <&3 3<&- &
fi
pid=$!
exec 3<&-
for s in INT TERM HUP QUIT USR1 USR2; do trap "kill -$s $pid 2>/dev/null" $s; done
while :; do
  wait $pid 2>/dev/null
  rc=$?
  kill -0 $pid 2>/dev/null || break
done
v1= v2=
while IFS=: read -r _ c d; do
  case ",$c," in *,memory,*) v1=$d ;; ,,) v2=$d ;; esac
done < /proc/self/cgroup
if [ -n "$v1" ]; then
  d=/sys/fs/cgroup/memory${v1%/task_*} f=memory.max_usage_in_bytes c=total_cache s=total_shmem
else d=/sys/fs/cgroup${v2%/task_*} f=memory.peak c=file s=shmem; fi
p=$(cat "$d/$f" 2>/dev/null)
if [ -n "$p" ]; then
  k=0 h=0
  { while read -r n v; do case $n in "$c") k=$v ;; "$s") h=$v ;; esac; done < "$d/memory.stat"; } 2>/dev/null
  p=$((p - k + h))
  [ "$p" -ge 0 ] || p=0
fi
printf '%s%s:%s:%s:%s:%s\n' 'MARK' "$SLURM_JOB_ID" "$p" "$rc" "$t0" "$(date +%s.%N 2>/dev/null)" >&2
exit $rc
"""


def new_token() -> str:
    """A per-run token: in the job's comment and in the wrapper's marker."""
    return os.urandom(8).hex()


def marker(token: str) -> bytes:
    """What starts the wrapper's line: a unit separator byte, so no job's text looks like it."""
    return f"\x1fhostrun-peak:{token}:".encode()


NO_DIRECTORY = b"nodir"  # the wrapper's line says the job's directory is not on the node
NO_COMMAND = b"noexec"  # ... or that the node has no such command


def wrapper_script(token: str, directory: str | None = None) -> str:
    """The wrapper for one run. ``directory``: where the job must run; slurmstepd, when it cannot
    enter the directory given with ``--chdir``, only says so and starts the task in /tmp instead,
    where a ``rm -rf build`` would act on the wrong tree: the wrapper enters it itself (a no-op
    where slurmstepd did) and, where it cannot, reports it and runs nothing."""
    check = ""
    if directory is not None:
        import shlex

        check = (f"cd -- {shlex.quote(directory)} 2>/dev/null || "
                 f"{{ printf '%s%s:{NO_DIRECTORY.decode()}\\n' 'MARK' \"$SLURM_JOB_ID\" >&2; exit 78; }}")
    return WRAPPER.replace("CHDIR", check).replace("MARK", marker(token).decode())


def mem_flag(cap: int) -> str:
    """``--mem`` in whole MiB, rounded up (Slurm's unit; a cap is never made smaller)."""
    return f"--mem={-(-cap // MiB)}M"


def time_flag(seconds: float) -> str:
    """``--time`` in whole minutes, rounded up: Slurm counts time limits in minutes."""
    return f"--time={max(1, -(-int(seconds) // 60))}"


def srun_argv(request: RunRequest, options: SlurmOptions, *, label: str, token: str, cap: int | None,
              threads: int, max_runtime: float | None, cwd: str | None, stdin: bool) -> list[str]:
    """The whole command run on the submitting side: hostrun's flags, then the site's own
    (``srun_args``, which may override them), then the wrapper and the job's argv as they are."""
    argv = ["srun", f"--job-name={label}", f"--comment={COMMENT_PREFIX}{token}",
            f"--cpus-per-task={threads}"]
    if cwd is not None:  # None: srun's own directory (a login node's session is started in it)
        argv.append(f"--chdir={cwd}")
    if cap is not None:
        argv.append(mem_flag(cap))
    if max_runtime is not None:
        argv.append(time_flag(max_runtime))
    if request.gpu_memory:
        argv.append("--gres=gpu:1")
    for flag, value in (("--partition", options.partition), ("--account", options.account),
                        ("--qos", options.qos)):
        if value:
            argv.append(f"{flag}={value}")
    if not stdin:
        argv.append("--input=none")
    command = list(request.argv)
    return [*argv, *options.srun_args, "sh", "-c", wrapper_script(token, cwd), command[0], *command]


class MarkerFilter:
    """Takes the wrapper's line out of a byte stream fed in arbitrary chunks; the rest passes intact.

    A chunk's tail that could be the start of the marker is held back until the next chunk says
    whether it is; ``finish`` hands back whatever is still held.
    """

    def __init__(self, token: str) -> None:
        self.mark = marker(token)
        self.held = b""
        self.line: bytes | None = None  # the wrapper's line, without the marker and newline
        self._in_line = False

    def feed(self, data: bytes) -> bytes:
        buf = self.held + data
        self.held = b""
        out: list[bytes] = []
        while buf:
            if self._in_line:
                end = buf.find(b"\n")
                if end < 0:
                    self.line = (self.line or b"") + buf
                    return b"".join(out)
                self.line = (self.line or b"") + buf[:end]
                self._in_line = False
                buf = buf[end + 1:]
                continue
            start = buf.find(self.mark)
            if start >= 0:
                out.append(buf[:start])
                self._in_line = True
                self.line = b""
                buf = buf[start + len(self.mark):]
                continue
            keep = _partial_suffix(buf, self.mark)
            out.append(buf[:len(buf) - keep])
            self.held = buf[len(buf) - keep:]
            break
        return b"".join(out)

    def finish(self) -> bytes:
        held, self.held = self.held, b""
        return held

    @property
    def no_command(self) -> bool:
        """The node has no such command: the wrapper ran nothing (127)."""
        return self.line is not None and self.line.endswith(b":" + NO_COMMAND)

    @property
    def no_directory(self) -> bool:
        """The wrapper found no job directory on the node and ran nothing."""
        return self.line is not None and self.line.endswith(b":" + NO_DIRECTORY)

    def reported(self) -> tuple[str | None, int | None]:
        """The job id and peak the wrapper printed (None where it printed none, or nothing)."""
        if self.line is None:
            return None, None
        job_id, _, rest = self.line.decode("ascii", "replace").partition(":")
        peak = rest.partition(":")[0]
        return job_id or None, int(peak) if peak.strip().isdigit() else None

    @property
    def ran_for(self) -> float | None:
        """The seconds the job ran on the node, from the wrapper's clock readings (None where it
        printed none: a ``date`` without ``%N``, or no line)."""
        if self.line is None or self.no_directory:
            return None
        parts = self.line.decode("ascii", "replace").split(":")
        try:
            return max(0.0, float(parts[4]) - float(parts[3])) if len(parts) > 4 else None
        except ValueError:
            return None

    @property
    def status(self) -> int | None:
        """The job's own exit status as the wrapper saw it (128+N: killed by signal N)."""
        if self.line is None or self.no_directory or self.no_command:
            return None
        parts = self.line.decode("ascii", "replace").split(":")
        return int(parts[2]) if len(parts) > 2 and parts[2].strip().isdigit() else None


def _partial_suffix(buf: bytes, mark: bytes) -> int:
    """The length of the longest end of ``buf`` that is a proper start of ``mark``."""
    for size in range(min(len(buf), len(mark) - 1), 0, -1):
        if mark.startswith(buf[-size:]):
            return size
    return 0


LOST = ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED")
OVER_TIME = ("TIMEOUT", "DEADLINE")


def verdict(state: str | None, srun_status: int, exit_signal: int = 0, interrupted: int | None = None,
            where: str = "the cluster", finished: bool = False, job_status: int | None = None
            ) -> Verdict:
    """hostrun's exit code for a job that ended in ``state`` (None: its record could not be read),
    srun having exited with ``srun_status``; ``interrupted``: the signal hostrun handed on (and then
    cancelled it for); ``finished``: the node's wrapper saw the job end and passed its status on
    (``job_status``, as the wrapper saw it: srun's own differs after an OOM kill).

    The state decides, not srun's status: srun exits 1 for a step the cgroup OOM-killed. A job that
    ended by itself after a handed-on signal (its handler exited 3, say) gives its own status, as a
    local one does, even though Slurm calls the step CANCELLED.
    """
    if state == "OUT_OF_MEMORY" and finished and job_status == 0:
        return Verdict(0, "exit", None, (f"a process of the job was OOM-killed at its --mem on {where} "
                                         "(state OUT_OF_MEMORY), but the job exited 0; passing 0 through",))
    if state == "OUT_OF_MEMORY":
        return Verdict.of(ExitCode.OWN_CAP,
                       f"Slurm killed the job at its --mem on {where} (state OUT_OF_MEMORY)")
    if state in OVER_TIME:
        return Verdict.of(ExitCode.MAX_RUNTIME,
                       f"Slurm stopped the job at its --time on {where} (state {state})")
    if state in LOST:
        return Verdict.of(ExitCode.CONNECTION_LOST,
                       f"the job's allocation on {where} was lost (state {state})")
    if interrupted is not None and not finished:
        return Verdict(SIGNAL_BASE + interrupted, "signal", None)
    if state == "CANCELLED" and not finished:
        sig = exit_signal or 15
        return Verdict(SIGNAL_BASE + sig, "signal", f"the job was cancelled on {where} (scancel)")
    if SIGNAL_BASE < srun_status <= SIGNAL_BASE + 64:  # past 128+64 no signal could say it: an exit
        return Verdict(srun_status, "signal")
    if srun_status < 0:  # srun itself was killed by a signal
        return Verdict(SIGNAL_BASE - srun_status, "signal")
    message = None if state is not None else "the job's end state could not be read from Slurm"
    return Verdict(srun_status, "exit", message)


_NEVER = ("Requested node configuration is not available", "Memory specification can not be satisfied",
          "Invalid generic resource")
_CONFIG = ("Invalid partition", "invalid partition", "Invalid account", "Invalid qos",
           "Invalid qos specification", "unrecognized option", "invalid option")


def submit_refusal(stderr: str, where: str) -> Verdict | None:
    """Slurm refused the job before it ran (no job started): why, as hostrun's code; else None."""
    line = next((ln for ln in reversed(stderr.splitlines()) if "srun: error:" in ln
                 or "srun: unrecognized" in ln or "srun: invalid" in ln), None)
    if line is None:
        return None
    said = line.split("error:", 1)[-1].strip() if "error:" in line else line.strip()
    if any(sign in stderr for sign in _NEVER):
        return Verdict.of(ExitCode.NEVER_FITS,
                       f"no node of {where} could ever hold the job: {said}")
    if any(sign in stderr for sign in _CONFIG):
        return Verdict.of(ExitCode.USAGE, f"{where} refused the job: {said}")
    if "Unable to allocate resources" in stderr:
        return Verdict.of(ExitCode.NOT_RUN, f"{where} refused the job: {said}")
    return None


def job_mem(cap: int | None, worst_peak: int | None, default_cap: int | None
            ) -> tuple[int | None, str | None]:
    """The ``--mem`` a job gets and why: its ``-m``; else the half rule on its label's worst peak
    recorded on the cluster (twice it, rounded up to 512 MiB: ``capacity.half_rule_cap``); else the
    host's ``default_cap``; else none (None, None: the cluster's own default, e.g. DefMemPerNode).
    The reason is the booking kind hostrun records: "cap" or "peak"."""
    if cap is not None:
        return cap, "cap"
    if worst_peak:
        from dispatch.local.capacity import half_rule_cap

        return half_rule_cap(worst_peak), "peak"
    if default_cap is not None:
        return default_cap, "cap"
    return None, None


def within_nodes(mem: int, largest: int | None) -> tuple[int, str | None]:
    """A ``--mem`` from the half rule, never more than the largest node has (``largest``, its
    RealMemory; None: unknown, left as it is): the rule's margin is a guess, while a request no node
    can hold is refused outright (243). Returns the size and, when cut, a warning."""
    if largest is None or mem <= largest:
        return mem, None
    from dispatch.core.units import format_size

    return largest, (f"the half rule asks {format_size(mem)} for this label, more than any node has; "
                     f"asking for the largest node's {format_size(largest)} instead")
