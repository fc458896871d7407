"""Doorbells: one FIFO per waiting booking (``state_dir/wake/<booking id>``), so a release wakes the
waiter that can use the room at once instead of every waiter polling (docs/admission.md, "Waiting").

Why a FIFO per waiter rather than one shared wake-up, an inotify watch or a lock the head holds:
the releaser picks whom to wake (the head of the queue, then each woken waiter passes it on only
while the ones behind could still get in), so a release costs one or two wake-ups, not one per
waiter; a waiter blocks in ``select`` with its safety timeout, costing no CPU; a byte written stays
in the pipe until read, so a ring that comes while the waiter is busy is never lost; and a dead
waiter is seen at once (opening a FIFO with no reader fails with ENXIO: the ring goes to the next).

Trust: the ``wake`` directory is private (0700, checked like the state dir); a waiter makes its own
FIFO 0600 and refuses one that is not its own (``UntrustedPathError``); a ringer writes only to a FIFO
of its own user, opened without following links and without blocking.
"""

from __future__ import annotations

import errno
import os
import stat

WAKE_DIR = "wake"


def wake_dir(state_dir: str) -> str:
    return os.path.join(state_dir, WAKE_DIR)


def bell_path(state_dir: str, booking_id: int) -> str:
    return os.path.join(state_dir, WAKE_DIR, str(booking_id))


def _ours(st: os.stat_result) -> bool:
    return stat.S_ISFIFO(st.st_mode) and st.st_uid == os.geteuid()


RUNG, ABSENT, DEAF = "rung", "absent", "deaf"


def ring(state_dir: str, booking_id: int, reclaim: bool = False) -> str:
    """Wake the waiter of ``booking_id``: RUNG; ABSENT when it has no FIFO (not waiting yet, or the
    path is not a FIFO of ours), DEAF when nobody reads its FIFO (killed): the caller rings the next.

    ``reclaim``: a waiter ahead was DEAF, so the one rung should try under the write lock, which
    reclaims the dead one's booking (a plain read would still count it ahead).
    """
    try:
        fd = os.open(bell_path(state_dir, booking_id),
                     os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:  # ENOENT: no bell; ENXIO: no reader; ELOOP: a link
        return DEAF if exc.errno == errno.ENXIO else ABSENT
    try:
        if not _ours(os.fstat(fd)):
            return ABSENT
        try:
            os.write(fd, b"R" if reclaim else b"!")
        except BlockingIOError:  # the pipe is full of unread rings: it will wake anyway
            pass
        return RUNG
    except OSError:
        return ABSENT
    finally:
        os.close(fd)


def remove(state_dir: str, booking_id: int) -> None:
    """Unlink the bell of a booking that is gone (released or reclaimed), if it is our FIFO."""
    path = bell_path(state_dir, booking_id)
    try:
        if _ours(os.lstat(path)):
            os.unlink(path)
    except OSError:
        pass


class Doorbell:
    """The waiter's end: made before the first admission attempt, so no ring after it is missed.

    Opened read-write (Linux): the waiter is also a writer, so the pipe never reads as end-of-file
    when a ringer closes it, and ``select`` blocks until the next byte.
    """

    def __init__(self, state_dir: str, booking_id: int) -> None:
        from dispatch.core.errors import UntrustedPathError
        from dispatch.guards.trust import private_dir

        private_dir(wake_dir(state_dir), fix="remove it; hostrun makes it again")
        self.path = bell_path(state_dir, booking_id)
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            pass
        else:
            if not _ours(st):  # planted: never listen on (or remove) what another user made
                raise UntrustedPathError(
                    f"refusing wake-up FIFO {self.path}: not a FIFO of this user (owner uid "
                    f"{st.st_uid}); fix: remove it, nobody else can write in the state dir")
            os.unlink(self.path)  # ours, left by a killed waiter of a recovered ledger's booking
        os.mkfifo(self.path, 0o600)
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        if not _ours(st) or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(self.fd)
            raise UntrustedPathError(f"refusing wake-up FIFO {self.path}: replaced as it was made")

    def wait(self, timeout: float) -> str:
        """Block up to ``timeout`` seconds; the rings read (all pending ones), ``""`` if none:
        ``"R"`` in it asks for a locked try (see ``ring``)."""
        import select

        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        got = b""
        if ready:
            try:
                while chunk := os.read(self.fd, 512):
                    got += chunk
            except BlockingIOError:
                pass
        return got.decode("ascii", "replace")

    def close(self) -> None:
        os.close(self.fd)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
