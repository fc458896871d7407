"""Writing alerts: one JSON line each, appended to the alert file (standard library only).

Shipped with the runner, which writes the alerts about its own verdicts (a job killed at its own cap,
250, or when the slice filled, 254) and about a long wait, when it runs for a controller on this host.
Reading, cursors and the watchdog are controller-only (``dispatch.placement.alerts``).

Every record carries the same fields (``FIELDS``): what happened (``kind``, ``time``, ``message``), the
job it is about (``host``, ``label``, ``session``, ``pid``, ``command``) and the suggested ``action``,
which hostrun never takes itself. ``session`` addresses the alert (None: every session).

An alert never blocks or fails a job: a write that fails is one warning line and the job goes on.
Records are written as JSON, escaping nothing else; whoever prints one escapes it
(``dispatch.core.text.printable``). Each record is one ``write`` on an ``O_APPEND`` descriptor, so
concurrent writers never interleave their lines.
"""

from __future__ import annotations

import os
import time

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence
    from typing import Any

    from dispatch.core.alertshape import Alert, WaitFigures
    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.local.admission.policy import Admission

FIELDS = ("kind", "time", "host", "label", "session", "pid", "command", "action", "message")

PEER_COULD_TAKE = "peer-could-take"
WAITING = "waiting"
OWN_CAP = "own-cap"
SLICE_FULL = "slice-full"
PEER_UNREACHABLE = "peer-unreachable"
KINDS = (PEER_COULD_TAKE, WAITING, OWN_CAP, SLICE_FULL, PEER_UNREACHABLE)


def record(kind: str, *, host: str, label: str, session: str | None, command: str, action: str,
           message: str, pid: int | None = None, **extra: Any) -> Alert:
    """An alert with every common field set (``pid``: this process unless given)."""
    alert: Alert = {"kind": kind, "time": time.time(), "host": host, "label": label, "session": session,
                    "pid": os.getpid() if pid is None else pid, "command": command, "action": action,
                    "message": message}
    alert.update(extra)  # type: ignore[typeddict-item]  # each kind's own fields (Alert's others)
    return alert


def append(path: str, data: Alert) -> None:
    """Append one record (its directory created 0700 if missing, the file 0600); OSError on failure."""
    import json

    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    line = json.dumps({"time": time.time(), **data}, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


def write(path: str, data: Alert | None, say: Callable[[str], None]) -> bool:
    """``append``, but a failure is one warning line (``say``), never an exception: the job goes on.
    ``data`` None (``for_outcome``'s answer for a run that raises no alert): nothing to write."""
    if data is None:
        return False
    try:
        append(path, data)
        return True
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        say(f"warning: could not write the alert to {path}: {reason}")
        return False


def request_options(request: RunRequest | None) -> list[str]:
    """The job's own run options besides ``-m``, as given (``--max-runtime``, ``--gpu-memory``,
    ``--threads``, ``--group``, ``--when-idle``): a suggested command keeps them."""
    if request is None:
        return []
    words: list[str] = []
    if request.max_runtime is not None:
        words += ["--max-runtime", f"{request.max_runtime:g}s"]
    if request.gpu_memory is not None:
        words += ["--gpu-memory", size_option(request.gpu_memory)]
    if request.threads is not None:
        words += ["--threads", str(request.threads)]
    if request.group is not None:
        words += ["--group", request.group]
    if request.when_idle:
        words.append("--when-idle")
    return words


def hostrun_command(argv: Sequence[str], label: str, session: str | None, *, cap: int | None = None,
                    peer: str | None = None, options: Sequence[str] = ()) -> str:
    """The exact ``hostrun`` command that runs ``argv`` again (with ``-m``, on ``peer``, with the
    job's own other ``options``)."""
    import shlex  # imports re: kept off the hot path

    words = ["hostrun"]
    if cap is not None:
        words += ["-m", size_option(cap)]
    words += [*options, "--label", label]
    if session:
        words += ["--session", session]
    if peer is not None:
        words.append(f"--peer={peer}")
    return shlex.join([*words, "--", *argv])


def size_option(n: int) -> str:
    """``n`` bytes as ``-m`` reads it, exactly: ``3G``, ``1536M``, else whole KiB rounded up."""
    for unit, shift in (("G", 30), ("M", 20)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{-(-n // 1024)}K"


def resume_argv(argv: Sequence[str]) -> tuple[list[str], bool]:
    """An agent's command line that resumes its last session in the same directory, and whether
    hostrun knows how for that agent (Claude Code: ``--continue``); else the command as it was."""
    import os

    if os.path.basename(argv[0]) == "claude":
        kept = [a for a in argv[1:] if a not in ("-c", "--continue")]
        if "-r" in kept or "--resume" in kept or any(a.startswith("--resume=") for a in kept):
            return [argv[0], *kept], True  # it named the session to resume: that one again
        return [argv[0], "--continue", *kept], True
    return list(argv), False


def _for_session(outcome: Outcome, base: dict[str, Any], slice_limit: int | None) -> Alert:
    """A session killed at its cap (250) or because the sessions slice (or the slice) filled (254):
    how to resume it, with the cap the half rule gives for its peak (at most the sessions slice)."""
    import shlex

    from dispatch.core.exitcodes import ExitCode
    from dispatch.core.units import format_size
    from dispatch.local.capacity import half_rule_cap

    peak = outcome.peak_bytes or 0
    argv, known = resume_argv([str(a) for a in outcome.argv])
    label = outcome.label.removeprefix("session:")
    own = outcome.is_verdict(ExitCode.OWN_CAP)
    cap = half_rule_cap(max(peak, outcome.cap_bytes or 0)) if own else outcome.cap_bytes
    words = ["hostrun", "session", "--label", label]
    if cap:
        words += ["-m", size_option(cap)]
    action = shlex.join([*words, "--", *argv])
    how = "" if known else " (with your agent's own option to resume its last session)"
    if own:
        why = (f"was killed at its own cap {format_size(outcome.cap_bytes)} (peak {format_size(peak)}); "
               f"its jobs and the other sessions went on. Resume it with the cap the half rule gives")
    else:
        why = (f"was killed because the sessions slice or the slice was full (peak {format_size(peak)}, "
               "under its cap). Resume it")
    message = f"agent session {outcome.label} on {base['host']} {why}: {action}{how}"
    kind = OWN_CAP if own else SLICE_FULL
    return record(kind, action=action, message=message, suggested_cap=cap if own else None, **base)


def for_outcome(outcome: Outcome, session: str | None, peer: str | None = None,
                slice_limit: int | None = None, request: RunRequest | None = None
                ) -> Alert | None:
    """The alert for a run that hostrun saw killed at its own cap (250) or in a full slice (254),
    else None: the verdict decides (the OOM counters), never the exit number, which a job may
    return by itself.

    250's action is the same command with the cap the half rule suggests from the run's peak (at
    least twice the peak, rounded up to 512 MiB: ``dispatch.local.capacity``); 254's is the same
    command again (the label is now marked and booked at its cap: it waits for that room), with the
    job's own ``-m``. Both keep the job's other options (``request``)."""
    from dispatch.core.exitcodes import ExitCode

    if not outcome.is_verdict(ExitCode.OWN_CAP, ExitCode.SLICE_FULL):
        return None
    from dispatch.core.units import format_size

    argv = [str(a) for a in outcome.argv]
    import shlex

    where = outcome.host if peer is None else peer
    peak = outcome.peak_bytes or 0
    base: dict[str, Any] = {
        "host": where, "label": outcome.label, "session": session, "command": shlex.join(argv),
        "exit_code": int(outcome.exit_code), "peak": outcome.peak_bytes, "cap": outcome.cap_bytes}
    if request is not None and request.role == "session":
        return _for_session(outcome, base, slice_limit)
    if outcome.is_verdict(ExitCode.OWN_CAP):
        from dispatch.local.capacity import half_rule_cap

        suggested = half_rule_cap(max(peak, outcome.cap_bytes or 0))
        action = hostrun_command(argv, outcome.label, session, cap=suggested, peer=peer,
                                 options=request_options(request))
        over = ""
        if slice_limit is not None and suggested > slice_limit:
            over = f"; that is more than the whole slice ({format_size(slice_limit)}) there"
        message = (f"job {outcome.label} on {where} was killed at its own cap "
                   f"{format_size(outcome.cap_bytes)} (peak {format_size(peak)}); the half rule "
                   f"suggests -m {size_option(suggested)}{over}: {action}")
        return record(OWN_CAP, suggested_cap=suggested, action=action, message=message, **base)
    action = hostrun_command(argv, outcome.label, session, peer=peer,
                             cap=request.cap if request is not None else None,
                             options=request_options(request))
    message = (f"job {outcome.label} on {where} was killed because the slice was full (peak "
               f"{format_size(peak)}, under its cap); other jobs took the room. Run it again (now "
               f"booked at its cap): {action}")
    return record(SLICE_FULL, action=action, message=message, **base)


def for_unreachable(host: str, label: str, session: str | None, argv: Sequence[str],
                    error: str, request: RunRequest | None = None) -> Alert:
    """A ``--peer`` run that could not start because ``host`` could not be reached (246)."""
    import shlex

    from dispatch.core.exitcodes import ExitCode

    action = hostrun_command(argv, label, session, cap=request.cap if request is not None else None,
                             options=request_options(request))
    return record(PEER_UNREACHABLE, host=host, label=label, session=session,
                  command=shlex.join(argv), action=action,
                  exit_code=int(ExitCode.PEER_UNREACHABLE), error=error,
                  message=f"job {label} could not start on {host}: {error}; nothing ran. "
                          f"Run it here instead, or check the peer ('hostrun report --host "
                          f"{host}'): {action}")


def wait_figures(adm: Admission, waited: float) -> WaitFigures:
    """What a waiting job knows about its wait: the fields of a ``waiting`` alert of its own, and
    what a peer's agent sends its controller (``Frame.ALERT``), which writes the alert."""
    return {"waited_s": round(waited, 1), "need": adm.need, "free": adm.free,
            "position": adm.position, "policy": adm.policy,
            "holders": [{"label": b.label, "session": b.session, "size": b.size, "pid": b.pid}
                        for b in adm.holders]}


def checked_figures(data: object) -> WaitFigures | None:
    """``wait_figures`` as read from a peer: every field of the right type (a text too long is
    cut), else None. What a peer sends is data to show, never to act on."""
    def text(value: object) -> str | None:
        return value[:200] if isinstance(value, str) else None

    def number(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if not isinstance(data, dict) or not all(number(data.get(k)) for k in
                                             ("waited_s", "need", "free", "position")):
        return None
    holders = data.get("holders")
    if not isinstance(holders, list) or len(holders) > 1000 or not all(
            isinstance(h, dict) and isinstance(h.get("label"), str) and number(h.get("size"))
            and number(h.get("pid")) for h in holders):
        return None
    policy = data.get("policy")
    return {"waited_s": float(data["waited_s"]), "need": int(data["need"]),
            "free": int(data["free"]), "position": int(data["position"]),
            "policy": text(policy),
            "holders": [{"label": text(h["label"]), "session": text(h.get("session")),
                         "size": int(h["size"]), "pid": int(h["pid"])} for h in holders]}


def for_wait(figures: WaitFigures, *, host: str, label: str, session: str | None,
             argv: Sequence[str], peer: bool = False, pid: int | None = None) -> Alert:
    """The ``waiting`` alert from ``wait_figures``; ``peer``: the job waits on ``host``, a peer,
    so "elsewhere" is here (else it is a peer, named ``NAME`` in the action)."""
    import shlex

    from dispatch.core.units import format_duration, format_size

    held = ", ".join(f"{h['label']} ({h['session'] or 'no session'}, {format_size(h['size'])})"
                     for h in figures["holders"]) or "nobody (other waiters ahead, or a queue policy)"
    why = f"; {figures['policy']}" if figures.get("policy") else ""
    message = (f"job {label} has waited {format_duration(figures['waited_s'])} on {host} for "
               f"{format_size(figures['need'])} (free {format_size(figures['free'])}, "
               f"{figures['position']} ahead{why}); the room is held by {held}")
    if peer:
        elsewhere = f"here: {hostrun_command(argv, label, session)}"
        queue = f"'hostrun ledger' on {host}"
    else:
        elsewhere = f"elsewhere: {hostrun_command(argv, label, session, peer='NAME')}"
        queue = "'hostrun ledger'"
    action = (f"wait (it starts when room frees), or see the queue with {queue}, or stop it and run "
              f"it {elsewhere}")
    fields = {k: v for k, v in figures.items() if k != "policy"}
    return record(WAITING, host=host, label=label, session=session, command=shlex.join(argv),
                  action=action, message=message, pid=pid, **fields)


class WaitAlert:
    """The admission wait loop's ``on_wait``: one alert when a job has waited ``after`` seconds,
    naming who holds the room (the running bookings' labels, sessions and sizes). Chains to ``then``
    (the peer watch), so both keep working. ``deliver``: a peer's agent hands the figures to its
    controller instead (``Frame.ALERT``), which says and files the alert as its own."""

    def __init__(self, path: str, after: float, host: str, label: str, session: str | None,
                 argv: Sequence[str], say: Callable[[str], None],
                 then: Callable[[Admission], None] | None = None, started: float | None = None,
                 deliver: Callable[[WaitFigures], None] | None = None) -> None:
        self.path = path
        self.after = after
        self.host = host
        self.label = label
        self.session = session
        self.argv = list(argv)
        self.say = say
        self.then = then
        self.started = time.monotonic() if started is None else started
        self.deliver = deliver
        self.alerted = False

    def __call__(self, adm: Admission) -> None:
        if self.then is not None:
            self.then(adm)
        waited = time.monotonic() - self.started
        if self.alerted or waited < self.after:
            return
        self.alerted = True
        figures = wait_figures(adm, waited)
        if self.deliver is not None:
            self.deliver(figures)
            return
        alert = for_wait(figures, host=self.host, label=self.label, session=self.session,
                         argv=self.argv)
        self.say(f"alert: {alert['message']}")
        write(self.path, alert, self.say)
