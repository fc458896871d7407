"""A parked run's process (``dispatch.local.engine.park``): ``python3 -I -S parked.py FD STARTED ALARM BOOKING
NOT_RUN EXE ARGV...``. Run as a script, it imports nothing but built-in modules, so that it holds
little more than the interpreter while it waits.

It reads the admission engine's messages on descriptor FD (4 bytes of length, then ``marshal``),
prints the waiting lines as the run would, and execs EXE ARGV (the run's own command line) with
``HOSTRUN_RESUME="FD BOOKING STARTED WHY"`` when the run's turn is near (``soon``), it is admitted,
the connection ends (``gone``), a signal ends the wait (``signal:N``) or, after ALARM seconds, the
long-wait alert is due (``alert``). When that exec fails, it exits NOT_RUN (78) with one line. The
signals that end a wait are held back across each exec, so none is lost between the handlers of
one program and the next.
"""

import _signal  # type: ignore[import-not-found]  # the C module: signal would import enum
import marshal
import os
import sys

ENDING = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)


def main(argv: list[str]) -> None:
    fd, started, alarm, booking, not_run = int(argv[0]), argv[1], int(argv[2]), argv[3], int(argv[4])
    exe, command = argv[5], argv[6:]

    def resume(why: str) -> None:
        _signal.alarm(0)
        _signal.pthread_sigmask(_signal.SIG_BLOCK, ENDING)
        os.environ["HOSTRUN_RESUME"] = f"{fd} {booking} {started} {why}"
        try:
            os.execv(exe, command)
        except OSError as exc:
            line = f"hostrun: error: a waiting run could not resume ({exe}: {exc.strerror}); nothing ran\n"
            os.write(2, line.encode(errors="replace"))
            os._exit(not_run)  # ExitCode.NOT_RUN, handed over: nothing is imported here

    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            try:
                chunk = os.read(fd, n - len(data))
            except OSError:
                chunk = b""
            if not chunk:
                resume("gone")
            data += chunk
        return data

    for sig in ENDING:
        _signal.signal(sig, lambda signum, frame: resume(f"signal:{signum}"))
    _signal.signal(_signal.SIGALRM, lambda signum, frame: resume("alert"))
    if alarm > 0:
        _signal.alarm(alarm)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, ENDING)
    while True:
        message = marshal.loads(read(int.from_bytes(read(4), "big")))
        op = message.get("op") if type(message) is dict else None
        if op in ("wait", "say") and type(message.get("line")) is str:
            os.write(2, ("hostrun: " + message["line"] + "\n").encode(errors="replace"))
        elif op in ("soon", "admitted"):
            resume(op)


if __name__ == "__main__":
    main(sys.argv[1:])
