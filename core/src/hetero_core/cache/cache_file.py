"""Cache files that prove they are whole: a checksum footer, checked before the bytes are used.

Every file Hetero keeps in its cache and loads again (the compiled kernels, the prepared weights,
the CPU dtype-speed record, the manifest of a converted model) is written through ``written_checked``:
the caller writes the payload to a temporary file, a one-line text footer records the payload's
length and checksum, and the file replaces the old one in one rename (``atomic_file``), so a reader
never sees a half-written file and two processes writing at once both leave a whole one. Readers
call ``read_checked`` (small files) or ``map_checked`` (memory-mapped, for model-sized ones), which
raise ``CacheFileInvalid`` saying what is wrong; the caller rebuilds the file and calls
``warn_rebuilding``: one warning line, ``cache.file_invalid``. Files another library must open
as they are (a converted model's config, tokenizer and weights) are listed with their checksums in a
manifest (``write_manifest``, ``check_listed``), itself a checked file.

The checksum: the payload read as 64-bit words, summed (mod 2**64) per 1 MiB chunk (by torch on
every core for model-sized files), the sums hashed with the length and the file's name (BLAKE2b).
It runs at memory speed (~16 ms for a 325 MB file on 2 cores) and the pages it faults in are those
the model reads next.
It catches a file that is truncated, extended, zeroed or overwritten (random bytes, another file),
copied from another key (the name carries the key), written without a footer (an older version, a
killed writer on a crashing disk), and any change to one chunk's sum: a flipped bit, a lost or
zeroed block, swapped chunks. It misses changes that keep every chunk's sum (words permuted within
a chunk, errors that cancel) and deliberate tampering: the threat is disk corruption, truncation,
half-written files and stale formats, not an attacker.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hetero_core.cache.atomic_file import replaced_atomically
from hetero_core.logging import get_logger

log = get_logger("hetero.cache")

CHUNK_WORDS = 1 << 17  # 64-bit words per partial sum (1 MiB)
PARALLEL_BYTES = 64 << 20  # files this big are summed by torch on every core, smaller ones by numpy
FOOTER = "\n#hetero-cache v1 {length:016x} {checksum}\n"
FOOTER_BYTES = len(FOOTER.format(length=0, checksum="0" * 32))
_FOOTER_PATTERN = re.compile(rb"\n#hetero-cache v1 ([0-9a-f]{16}) ([0-9a-f]{32})\n")
MANIFEST = "hetero-manifest.json"
DAMAGED = "checksum mismatch: the content was damaged or overwritten"


class CacheFileInvalid(Exception):
    """A cache file that must not be used; ``problem`` says what is wrong with it."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = Path(path), problem


def warn_rebuilding(error: CacheFileInvalid) -> None:
    """The one line a rebuilt cache file costs."""
    log.warning("cache.file_invalid", path=str(error.path), problem=error.problem, action="rebuilding")


def checksum(data, name: str) -> str:
    """The checksum of ``data`` (a 1-D uint8 numpy array or torch tensor) as the file ``name``."""
    import numpy as np

    array = data.numpy() if hasattr(data, "numpy") else data
    length = array.size
    num_words = length // 8
    whole = num_words - num_words % CHUNK_WORDS
    words = array[: num_words * 8].view(np.int64)
    if length >= PARALLEL_BYTES:  # every core; the same sums (integer adds wrap in any order)
        import torch

        chunk_sums = torch.from_numpy(words[:whole]).view(-1, CHUNK_WORDS).sum(1).numpy()
    else:  # one thread: waking torch's pool costs more than small files take (and no torch loads)
        chunk_sums = words[:whole].reshape(-1, CHUNK_WORDS).sum(1)
    digest = hashlib.blake2b(f"{name}\0{length}\0".encode(), digest_size=16)
    digest.update(chunk_sums.tobytes())
    digest.update(words[whole:].sum(dtype=np.int64).tobytes())
    digest.update(array[num_words * 8 :].tobytes())
    return digest.hexdigest()


def map_file(path: Path):
    """``path``'s bytes as a 1-D uint8 tensor, memory-mapped copy-on-write (the pages stay shared)."""
    import torch

    return torch.from_numpy(_map_array(path))


def map_checked(path: Path):
    """The payload of the checked file ``path`` as a memory-mapped 1-D uint8 tensor
    (FileNotFoundError when it is absent)."""
    import torch

    return torch.from_numpy(_checked_payload(path))


def read_checked(path: Path) -> bytes:
    """The payload of the small checked file ``path`` (FileNotFoundError when it is absent). Imports
    no torch: the builder reads a converted model's manifest before the executor's factory runs."""
    return _checked_payload(path).tobytes()


def _map_array(path: Path):
    """``path``'s bytes as a 1-D uint8 numpy array, memory-mapped copy-on-write."""
    import numpy as np

    with open(path, "rb") as file:
        size = file.seek(0, 2)
        if size == 0:
            return np.empty(0, dtype=np.uint8)
        mapped = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY)
    return np.frombuffer(mapped, dtype=np.uint8)


def _checked_payload(path: Path):
    """The payload of the checked file ``path``, a view of its mapping (numpy), once its footer and
    checksum agree (CacheFileInvalid otherwise)."""
    try:
        data = _map_array(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CacheFileInvalid(path, f"cannot be read: {exc}") from None
    size = data.size
    match = _FOOTER_PATTERN.fullmatch(data[-FOOTER_BYTES:].tobytes() if size else b"")
    if match is None:
        raise CacheFileInvalid(
            path,
            "empty"
            if size == 0
            else "no checksum footer (truncated, overwritten, or written by an older version)",
        )
    length = int(match.group(1), 16)
    if length != size - FOOTER_BYTES:
        raise CacheFileInvalid(path, f"{size - FOOTER_BYTES} bytes where its footer says {length}")
    payload = data[:length]
    if checksum(payload, Path(path).name) != match.group(2).decode():
        raise CacheFileInvalid(path, DAMAGED)
    return payload


@contextmanager
def written_checked(target: Path, suffix: str) -> Iterator[str]:
    """A temporary path for the caller to write the payload of ``target`` to; on a normal exit the
    footer is appended and the file replaces ``target`` atomically (see ``replaced_atomically``)."""
    with replaced_atomically(target, suffix) as tmp:
        yield tmp
        footer = FOOTER.format(
            length=Path(tmp).stat().st_size, checksum=checksum(_map_array(Path(tmp)), target.name)
        )
        with open(tmp, "ab") as file:
            file.write(footer.encode())
        os.chmod(tmp, os.stat(tmp).st_mode | 0o444)  # mkstemp makes it private; the cache is shared


def write_checked(target: Path, payload: bytes) -> None:
    with written_checked(target, ".tmp") as tmp:
        Path(tmp).write_bytes(payload)


def write_manifest(folder: Path, **facts) -> None:
    """List every file of ``folder`` with its size and checksum (and ``facts``) in its manifest."""
    files = {
        p.name: [p.stat().st_size, checksum(_map_array(p), p.name)]
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    write_checked(folder / MANIFEST, json.dumps({**facts, "files": files}, indent=1).encode())


def read_manifest(folder: Path) -> dict:
    """``folder``'s manifest (CacheFileInvalid when it is missing or damaged)."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(read_checked(path))
    except FileNotFoundError:
        raise CacheFileInvalid(
            folder, f"no {MANIFEST} (written by an older version, or not by Hetero)"
        ) from None
    except ValueError as exc:
        raise CacheFileInvalid(path, f"not JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CacheFileInvalid(path, "not a manifest")
    return manifest


def check_listed(folder: Path, manifest: dict, names, checksummed=None) -> None:
    """Every file of ``names`` is in ``folder`` with the size the manifest lists; those of
    ``checksummed`` (default: all) with its checksum too. Sizes first: a truncation costs no read."""
    listed = manifest["files"]
    for name in names:
        path = folder / name
        if name not in listed:
            raise CacheFileInvalid(path, "not in the manifest")
        size = path.stat().st_size if path.is_file() else None
        if size != listed[name][0]:
            raise CacheFileInvalid(
                path,
                f"{'missing' if size is None else f'{size} bytes'} where the "
                f"manifest lists {listed[name][0]} bytes",
            )
    for name in names if checksummed is None else checksummed:
        try:
            data = _map_array(folder / name)
        except OSError as exc:
            raise CacheFileInvalid(folder / name, f"cannot be read: {exc}") from None
        if checksum(data, name) != listed[name][1]:
            raise CacheFileInvalid(folder / name, DAMAGED)


def read_json_object(path: Path) -> dict:
    """A checked cache file holding one JSON object; {} when there is none or it is damaged (one
    warning: the caller measures again and rewrites it)."""
    try:
        data = json.loads(read_checked(path))
        if not isinstance(data, dict):
            raise CacheFileInvalid(path, f"a JSON {type(data).__name__}, not an object")
    except FileNotFoundError:
        return {}
    except ValueError as exc:  # not JSON (its checksum was right: a bug, never the disk)
        warn_rebuilding(CacheFileInvalid(path, f"not JSON: {exc}"))
        return {}
    except CacheFileInvalid as exc:
        warn_rebuilding(exc)
        return {}
    return data


def write_json_object(path: Path, data: dict, failed_event: str) -> None:
    """``data`` to ``path``, checked and atomic; a failure (a read-only cache) is logged as
    ``failed_event`` and costs only a measurement at the next start."""
    try:
        write_checked(path, json.dumps(data, indent=1, sort_keys=True).encode())
    except OSError as exc:
        log.info(failed_event, reason=str(exc))
