"""The remote agent: hostrun's standard-library core, shipped to a peer as one zipapp.

A peer needs only ``python3`` (>= 3.9) and ``rsync``; nothing is installed there. The controller
builds a deterministic zip of the shipped packages (``SHIPPED``: standard library only), names it
by its content hash and sends it once; the peer unpacks it to
``~/.cache/hostrun/agent-<version>-<hash>/`` and byte-compiles it with its own python there (a zipapp
would be recompiled on every run: ~25 ms each time). Different code means a different name, so
version skew is impossible by construction: a peer either has exactly this agent or gets it again.
"""

from __future__ import annotations

import os

import dispatch
from dispatch import __version__
from dispatch.core.configpath import cache_dir
from dispatch.core.fingerprint import sha256

# The packages a peer runs: the agent and what it imports. Each imports only standard library modules
# and these packages (tests/fast/test_import_cycles.py checks it), so nothing controller-only is shipped.
SHIPPED = ("core", "capping", "local", "guards", "agent")
REMOTE_DIR = ".cache/hostrun"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
MAIN = b"import sys\nfrom dispatch.agent.main import main\nsys.exit(main(sys.argv[1:]))\n"

_built: tuple[bytes, str] | None = None
_name: str | None = None


def _sources() -> list[tuple[str, str]]:
    """(name in the zip, path here) of every shipped source, in a fixed order."""
    root = os.path.dirname(os.path.abspath(dispatch.__file__))
    found = [("dispatch/__init__.py", os.path.join(root, "__init__.py"))]
    for package in SHIPPED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    found.append((f"dispatch/{os.path.relpath(path, root).replace(os.sep, '/')}", path))
    return found


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _files(sources: list[tuple[str, str]] | None = None) -> list[tuple[str, bytes]]:
    return [*((rel, _read(path)) for rel, path in sources or _sources()), ("__main__.py", MAIN)]


def name() -> str:
    """``<version>-<content hash>``, needed by every report and peer run. Hashing the ~70 sources
    costs ~4 ms, so the name is remembered in ``~/.cache/hostrun/bundle/name`` under a stamp of
    their stat data, taken before they are read: any write to a source changes its ctime (which no
    one can set back), a replaced file its inode, so a stale name is never reused."""
    global _name
    if _name is None:
        sources = _sources()
        stamp = _stamp(sources)
        directory = cache_dir(os.environ, "bundle")
        _name = _remembered(directory, stamp)
        if _name is None:
            digest = sha256()
            for path, data in _files(sources):
                digest.update(path.encode() + b"\0" + data + b"\0")
            _name = f"{__version__}-{digest.hexdigest()[:16]}"
            _remember(directory, stamp, _name)
    return _name


def _stamp(sources: list[tuple[str, str]]) -> str:
    digest = sha256(f"{__version__}\0{MAIN!r}".encode())
    for rel, path in sources:
        st = os.stat(path)
        digest.update(f"{rel}\0{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}\0"
                      .encode())
    return str(digest.hexdigest())


def _remembered(directory: str, stamp: str) -> str | None:
    """The name stored under ``stamp``, if only we could have written it (as the config cache)."""
    from dispatch.guards.trust import own_file_ok, private_dir_ok

    try:
        if not private_dir_ok(directory):
            return None
        fd = os.open(os.path.join(directory, "name"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not own_file_ok(os.fstat(fd)):
                return None
            kept, _, kept_name = fh.read(200).decode("ascii").strip().partition(" ")
    except (OSError, ValueError):
        return None
    return kept_name if kept == stamp and kept_name else None


def _remember(directory: str, stamp: str, computed: str) -> None:
    """Best effort: without a private cache directory the name is simply computed every time."""
    from dispatch.core.atomicfile import write_atomic
    from dispatch.core.errors import HostrunError
    from dispatch.guards.trust import private_dir

    try:
        write_atomic(os.path.join(private_dir(directory), "name"), f"{stamp} {computed}\n".encode())
    except (OSError, HostrunError):
        pass


def build() -> tuple[bytes, str]:
    """(zip bytes, name): built only when a peer lacks this agent. Deterministic."""
    global _built
    if _built is None:
        import io
        import zipfile

        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for path, data in _files():
                info = zipfile.ZipInfo(path, date_time=ZIP_EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, data)
        _built = (buf.getvalue(), name())
    return _built


def remote_path() -> str:
    """The agent's directory, relative to the peer's home (our ssh commands ``cd "$HOME"`` first)."""
    return f"{REMOTE_DIR}/agent-{name()}"
