"""Folders in the cache replaced whole: a finished temporary sibling put in a folder's place.

A file is replaced in one rename (``atomic_file``); a folder cannot be renamed over a folder that
has files in it. ``swap_in`` exchanges the two in one step where the kernel can (Linux
``renameat2(RENAME_EXCHANGE)``), so the folder's path never stops naming a whole folder, and
elsewhere moves the old one out of the way first (a moment where the path names nothing).
``exclusive`` serialises the processes that replace folders in one parent, so each one decides
whether to replace on what another finished, not on a folder halfway through being swapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import functools
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@contextmanager
def exclusive(parent: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``parent`` (an flock on the folder itself: no lock file
    is left in it) until the block ends; other processes' ``exclusive(parent)`` wait."""
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def swap_in(new: Path, target: Path) -> None:
    """Put the folder ``new`` at ``target`` (a folder that may be missing) and delete what was there."""
    if not target.exists():
        new.rename(target)
        return
    if _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now names the old folder
        return
    old = target.with_name(f".{target.name}.{os.getpid()}-{time.time_ns()}.tmp")
    target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step; False where this kernel, file system or C library cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    return renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0


@functools.cache
def _renameat2():
    """The C library's ``renameat2``, its arguments declared; None where there is none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2
