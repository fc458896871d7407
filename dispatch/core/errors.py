"""Exceptions hostrun raises, each carrying the exit code the CLI will use.

Errors are translated once, at the edge (``dispatch.cli.main``): library code raises one of these and never
calls ``sys.exit``. Every hostrun error class lives here, so the whole tree is in one place::

    HostrunError                    (exit_code from dispatch.core.exitcodes; host: where it happened)
    ├── UsageError                  2    bad arguments, bad or unreadable configuration
    │   └── ConfigError             2    a configuration key or value is wrong (names the key)
    │       └── UntrustedPathError  2    a file or directory someone else owns or can write (trust.py)
    ├── NotRunError                 78   a preflight condition was not met
    │   ├── GpuError                78   nvidia-smi exists but failed or did not answer in time
    │   └── NoSliceError            78   the default reserve leaves no slice on this machine
    ├── LockTimeoutError            78   ``lock --wait`` ran out while another holder kept DIR
    ├── NeverFitsError              243  cap larger than the host's whole slice
    ├── LongJobError                244  too long for one host and not declared long (--long-job-rule)
    ├── NoCapBackendError           78   no memory-cap backend works here and --no-cap was not given
    ├── BackendError                78   a backend failed while preparing the slice or the job
    │   ├── DBusError               78   systemd's manager answered with an error, or not at all
    │   └── SharedError             78   the shared slice's daemon refused a request or went away
    ├── LedgerError                 78   the ledger (state dir) cannot be read or written
    │   └── EngineError             78   the admission engine could not be reached or started
    │       └── EngineNotStartedError 78 one this run started never listened (5 started in turn)
    ├── PeerUnreachableError        246  the peer could not be reached or read in time (transient:
    │   │                                retried when ssh's reason looks like weather)
    │   ├── HostKeyError            246  its host key is unknown or changed (never retried)
    │   └── PeerAuthError           246  authentication failed (never retried)
    ├── ToolchainMismatchError      247  the peer's toolchain differs from this host's
    ├── AcrossDisabledError         248  a peer was asked for while enable_across_machines is off
    ├── OverPeerCapError            249  the cap exceeds the peer's peer_memory_cap
    ├── ConnectionLostError         251  the link to the peer broke once the job was started
    └── SyncFailedError             252  the tree (or a --return path) could not be synced
"""

from __future__ import annotations

from dispatch.core.exitcodes import ExitCode


class HostrunError(Exception):
    """Base class: a one-line message plus the exit code that says what happened, and the host it
    happened on (None: this one) so that a result file can name it."""

    exit_code: int = ExitCode.USAGE
    host: str | None = None
    # The word after "hostrun: " on its line: "error" is exit 2's (docs/exit-codes.md); a refusal
    # that is no mistake of the caller's says what it is about instead.
    prefix: str = "error"

    def __init_subclass__(cls, code: int | None = None) -> None:
        """``class XError(HostrunError, code=ExitCode.Y)``: XError's exit code (else its parent's)."""
        super().__init_subclass__()
        if code is not None:
            cls.exit_code = code

    def __init__(self, message: str, exit_code: int | None = None, host: str | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        if host is not None:
            self.host = host


class UsageError(HostrunError, code=ExitCode.USAGE):
    """Bad arguments, or a configuration that cannot be read."""


class ConfigError(UsageError):
    """A configuration problem; the message names the file and the key."""


class UntrustedPathError(ConfigError):
    """Another user could steer hostrun through this file or directory; the message says the fix."""


class NotRunError(HostrunError, code=ExitCode.NOT_RUN):
    """A preflight condition was not met: the command did not run."""


class GpuError(NotRunError):
    """nvidia-smi exists but failed or did not answer in time."""


class NoSliceError(NotRunError):
    """No slice is configured and the default reserve leaves none here: nobody erred, the machine
    is small; the line says what to add where (``dispatch.core.sliceadvice``)."""

    prefix = "no slice"


class LockTimeoutError(HostrunError, code=ExitCode.NOT_RUN):
    """``--wait`` ran out while another holder kept DIR: the command did not run, so 78 ("nothing
    ran"), not 253 (which says a job ran past its max runtime)."""


class NeverFitsError(HostrunError, code=ExitCode.NEVER_FITS):
    """The cap is larger than the host's whole slice: waiting can never help."""


class LongJobError(HostrunError, code=ExitCode.LONG_SINGLE_HOST):
    """A run here with ``--long-job-rule`` is recorded or declared longer than
    ``long_job_threshold`` and does not declare itself long (the dispatcher's rule 0)."""


class NoCapBackendError(HostrunError, code=ExitCode.NOT_RUN):
    """No memory-cap backend works here and ``--no-cap`` was not given."""


class BackendError(HostrunError, code=ExitCode.NOT_RUN):
    """A cap backend failed while preparing the slice or the job's cgroup."""


class DBusError(BackendError):
    """A D-Bus error reply from systemd's manager (``name``: e.g.
    ``org.freedesktop.DBus.Error.AccessDenied``), or a conversation that broke (``name`` empty)."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class SharedError(BackendError):
    """The shared slice's daemon (``dispatch.local.shared.sharedd``) refused a request, or the connection
    to it failed."""


class LedgerError(HostrunError, code=ExitCode.NOT_RUN):
    """The state dir's ledger cannot be used (read-only, disk full, damaged and not recoverable)."""

    @classmethod
    def of_state_dir(cls, state_dir: str, cause: OSError | None, detail: str, what: str) -> LedgerError:
        """One line naming the state dir and the errno (``cause``): ``state dir D: Read-only file
        system (EROFS) (ledger D/ledger.sqlite3)``; ``detail`` when no errno is known."""
        if cause is not None and cause.errno is not None:
            import errno

            name = errno.errorcode.get(cause.errno, str(cause.errno))
            detail = f"{cause.strerror} ({name})" + ("" if detail == str(cause) else f"; {detail}")
        return cls(f"state dir {state_dir}: {detail} ({what})")


class EngineError(LedgerError):
    """The admission engine (local/admitd) could not be reached or started: nothing was run."""


class EngineNotStartedError(EngineError):
    """The engine this run started never listened: killed as it started, or it cannot start (its
    log says why); the run starts another, up to ``admitclient.START_TRIES`` times."""


class PeerUnreachableError(HostrunError, code=ExitCode.PEER_UNREACHABLE):
    """The peer could not be reached; ``transient`` when ssh's reason (refused, reset, timed out)
    says another try may work."""

    transient: bool = False

    def __init__(self, message: str, exit_code: int | None = None, host: str | None = None,
                 transient: bool = False) -> None:
        super().__init__(message, exit_code, host)
        self.transient = transient


class HostKeyError(PeerUnreachableError):
    """Unknown or changed host key: a security decision for the user, so never retried."""


class PeerAuthError(PeerUnreachableError):
    """Authentication failed: retrying cannot help."""


class ToolchainMismatchError(HostrunError, code=ExitCode.TOOLCHAIN_MISMATCH):
    """The peer's toolchain differs from this host's."""


class AcrossDisabledError(HostrunError, code=ExitCode.ACROSS_DISABLED):
    """A peer was asked for while ``enable_across_machines`` is off."""


class OverPeerCapError(HostrunError, code=ExitCode.OVER_PEER_CAP):
    """The cap exceeds the peer's ``peer_memory_cap``."""


class ConnectionLostError(HostrunError, code=ExitCode.CONNECTION_LOST):
    """The link to the peer broke after the agent was told to go; the remote job was stopped."""


class SyncFailedError(HostrunError, code=ExitCode.SYNC_FAILED):
    """The tree (or a ``--return`` path) could not be synced."""
