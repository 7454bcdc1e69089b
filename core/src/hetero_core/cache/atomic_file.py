"""Files in the cache written whole or not at all: a temporary file beside the target, renamed over it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced_atomically(target: Path, suffix: str) -> Iterator[str]:
    """A temporary path beside ``target`` (``.<name>.XXXX<suffix>``, the directory created) for the
    caller to write. On a normal exit it replaces ``target`` in one rename, so readers see the old
    file or the new one and concurrent writers are fine; on an exception, or when the rename fails,
    it is removed and the exception propagates."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
