"""Directory work through file descriptors, for trees that another user may change meanwhile.

A path is looked up again by the kernel on every use, so a check on ``a/b`` and a removal of ``a/b``
may concern two different trees when someone swaps ``b`` (or ``a``) for a symbolic link in between.
Here every directory is opened one component at a time with ``O_NOFOLLOW | O_DIRECTORY`` and then
used only through its descriptor (``dir_fd``): a link put in place of a directory makes the open
fail instead of being followed, and a directory moved elsewhere is still the one we hold.
"""

from __future__ import annotations

import errno
import os
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(path: str) -> tuple[int, int]:
    """(fd of the parent, fd of ``path``), opened from ``/`` with no symbolic link followed anywhere.

    ``path`` must be absolute and below ``/``. OSError (ELOOP, ENOTDIR, ENOENT, …) when a component
    is not a real directory now.
    """
    parts = [p for p in path.split("/") if p]
    if not path.startswith("/") or not parts or any(p in (".", "..") for p in parts):
        raise OSError(errno.EINVAL, f"not a plain absolute path: {path}")
    parent, fd = -1, os.open("/", DIR_FLAGS)
    try:
        for part in parts:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            if parent >= 0:
                os.close(parent)
            parent, fd = fd, child
    except BaseException:
        for open_fd in (parent, fd):
            if open_fd >= 0:
                os.close(open_fd)
        raise
    return parent, fd


def _open_child(parent_fd: int, name: str, seen: os.stat_result, dev: int) -> int:
    """Open directory ``name`` in ``parent_fd``; it must still be the one ``seen`` and on ``dev``."""
    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    st = os.fstat(fd)
    if not os.path.samestat(seen, st) or st.st_dev != dev:
        os.close(fd)
        why = "is a mount point" if st.st_dev != dev else "changed while being removed"
        raise OSError(errno.EBUSY, f"{name} {why}")
    return fd


def remove_entry(parent_fd: int, name: str) -> None:
    """Remove ``name`` in directory ``parent_fd`` and everything below it, never leaving that tree.

    Links are unlinked, not followed; a directory on another device (a mount point) stops the
    removal with OSError. Iterative, so a deep tree needs one descriptor per level, not a deep stack.
    """
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    dev = os.fstat(parent_fd).st_dev
    top = _open_child(parent_fd, name, st, dev)
    # (parent fd, name, fd, names left): an fd is on the stack before its listing is read, so
    # the ``finally`` closes it whatever fails.
    stack: list[tuple[int, str, int, list[str]]] = [(parent_fd, name, top, [])]
    try:
        stack[0] = (parent_fd, name, top, os.listdir(top))
        while stack:
            pfd, pname, fd, names = stack[-1]
            if not names:
                stack.pop()
                os.close(fd)
                os.rmdir(pname, dir_fd=pfd)
                continue
            child = names.pop()
            cst = os.stat(child, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(cst.st_mode):
                cfd = _open_child(fd, child, cst, dev)
                stack.append((fd, child, cfd, []))
                stack[-1] = (fd, child, cfd, os.listdir(cfd))
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def remove_contents(dir_fd: int, keep: str = "") -> None:
    """Remove everything in the directory ``dir_fd`` except the entry named ``keep``."""
    for name in os.listdir(dir_fd):
        if name != keep:
            remove_entry(dir_fd, name)
