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

from dispatch import __version__
from dispatch.core.fingerprint import sha256

# The packages a peer runs: the agent and what it imports. Each imports only standard library modules
# and these packages (tests/test_import_cycles.py checks it), so nothing controller-only is shipped.
SHIPPED = ("core", "capping", "local", "guards", "agent")
REMOTE_DIR = ".cache/hostrun"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
MAIN = b"import sys\nfrom dispatch.agent.main import main\nsys.exit(main(sys.argv[1:]))\n"

_built: tuple[bytes, str] | None = None
_name: str | None = None


def _core_files() -> list[tuple[str, bytes]]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [("dispatch/__init__.py", _read(os.path.join(root, "__init__.py")))]
    for package in SHIPPED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, root).replace(os.sep, "/")
                    files.append((f"dispatch/{rel}", _read(path)))
    return files


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _files() -> list[tuple[str, bytes]]:
    return [*_core_files(), ("__main__.py", MAIN)]


def name() -> str:
    """``<version>-<content hash>``: reading and hashing the sources only (no zip), every call needs it."""
    global _name
    if _name is None:
        digest = sha256()
        for path, data in _files():
            digest.update(path.encode() + b"\0" + data + b"\0")
        _name = f"{__version__}-{digest.hexdigest()[:16]}"
    return _name


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
