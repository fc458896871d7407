"""The keyboard and the terminal's signals for ``hostrun top``: stdin in cbreak mode (each key as
typed, no echo; Ctrl-C still a signal), a resize (SIGWINCH) or a stop (SIGINT, SIGTERM, SIGHUP)
waking the wait for a key, and the terminal's settings put back however the view ends. ``KeyState``
is what the keys have asked for so far, pure so it is tested without a terminal."""

from __future__ import annotations

import os
import select
import signal
import termios
import tty

from dispatch.placement import SORTS

MYPY = False
if MYPY:
    from typing import Any, Optional

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
ESC = 0x1B


class KeyState:
    """``q`` quits, ``s`` cycles the jobs' sort, ``/`` starts typing a filter (Enter applies it, Esc
    clears it, Backspace takes a character back), Esc clears the filter, ``h`` or ``?`` toggles help.
    A terminal's escape sequences (arrows, function keys) are skipped."""

    def __init__(self) -> None:
        self.quit = False
        self.sort = SORTS[0]
        self.filter = ""
        self.typing: Optional[str] = None  # the filter being typed after "/", None: not typing
        self.help = False

    def feed(self, data: bytes) -> None:
        i = 0
        while i < len(data):
            byte = data[i]
            i += 1
            if byte == ESC and i < len(data) and data[i] in b"[O":  # CSI or SS3: skip it whole
                i += 1
                while i < len(data) and not 0x40 <= data[i] <= 0x7E:
                    i += 1
                i += 1
            elif byte == ESC:
                self.typing, self.filter = None, ""
            elif self.typing is not None:
                self._typed(byte)
            else:
                self._key(chr(byte))

    def _typed(self, byte: int) -> None:
        assert self.typing is not None
        if byte in (0x0A, 0x0D):
            self.filter, self.typing = self.typing, None
        elif byte in (0x7F, 0x08):
            self.typing = self.typing[:-1]
        elif 0x20 <= byte < 0x7F:
            self.typing += chr(byte)

    def _key(self, key: str) -> None:
        if key == "q":
            self.quit = True
        elif key == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif key == "/":
            self.typing = ""
        elif key in "h?":
            self.help = not self.help


class Terminal:
    """stdin's terminal in cbreak mode, and the signals that must wake the view, until ``close``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.saved = termios.tcgetattr(fd)
        self.resized = False
        self.stopped: Optional[int] = None  # the signal that asked the view to end
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._handlers: dict[int, Any] = {}
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w)
        for signum in (signal.SIGWINCH, *STOPS):
            self._handlers[signum] = signal.signal(signum, self._signalled)
        tty.setcbreak(fd, termios.TCSANOW)

    def _signalled(self, signum: int, frame: object) -> None:
        if signum == signal.SIGWINCH:
            self.resized = True
        else:
            self.stopped = signum

    def wait(self, timeout: float) -> bytes:
        """The keys typed within ``timeout`` seconds, or b"" as soon as a signal came; None of the
        terminal's input is lost (it stays queued until the next wait)."""
        ready, _, _ = select.select([self.fd, self._wake_r], [], [], max(0.0, timeout))
        if self._wake_r in ready:
            try:
                os.read(self._wake_r, 512)
            except BlockingIOError:
                pass
        if self.fd in ready:
            data = os.read(self.fd, 1024)
            if not data:  # the terminal is gone (hang-up): end as for SIGHUP
                self.stopped = signal.SIGHUP
            return data
        return b""

    def close(self) -> None:
        """The terminal's own settings (echo, line editing) and the old signal handlers back."""
        try:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
        except termios.error:
            pass
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._wake_r)
        os.close(self._wake_w)
