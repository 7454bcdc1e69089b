"""Ways a cache file gets damaged on disk, for the tests of the checked caches."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

DAMAGE = ("truncated", "empty", "random", "zeros", "zeroed block", "flipped bit", "extended")


def damage(path: Path, how: str) -> None:
    """Damage ``path`` in place: cut to half, emptied, overwritten whole (random bytes or zeros, the
    same size), a 4 KiB block zeroed or one bit flipped in the middle, or bytes appended."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    if how == "truncated":
        data = data[:middle]
    elif how == "empty":
        data = bytearray()
    elif how == "random":
        data = bytearray(os.urandom(len(data)))
    elif how == "zeros":
        data = bytearray(len(data))
    elif how == "zeroed block":
        data[middle : middle + 4096] = bytes(len(data[middle : middle + 4096]))
    elif how == "flipped bit":
        data[middle] ^= 0x10
    elif how == "extended":
        data += b"more"
    else:
        raise ValueError(f"unknown damage {how!r}; choices: {', '.join(DAMAGE)}")
    replace(path, bytes(data))


def replace(path: Path, data: bytes) -> None:
    """``path``'s content replaced by a new file: a file truncated in place faults (SIGBUS) every
    process that still maps it, the test's own earlier executors included."""
    tmp = path.with_name(path.name + ".damaged")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def overwrite_tensors(path: Path, fill: str) -> None:
    """Overwrite the tensor bytes of the safetensors file at the start of ``path`` with random bytes
    or zeros, leaving its header (and anything after the tensors) as it was: same size, parseable."""
    raw = path.read_bytes()
    start = 8 + int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:start])
    length = max(entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__")
    new = os.urandom(length) if fill == "random" else bytes(length)
    replace(path, raw[:start] + new + raw[start + length :])


def invalid_cache_warnings(caplog) -> list[str]:
    """The ``cache.file_invalid`` warnings ``caplog`` holds."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "cache.file_invalid" in r.getMessage()
    ]
