"""Convert a GGUF file once into a cached Hugging Face directory.

The cache lives in ``$HETERO_CACHE_DIR`` or ``~/.cache/hetero``, one folder per GGUF (keyed by
its file name and size). Conversion writes into a temporary sibling that is renamed into place,
so a killed conversion never leaves a half-written cache; temporaries it leaves behind are swept
on a later conversion.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from hetero_core.errors import ModelLoadError

CACHE_ENV = "HETERO_CACHE_DIR"
# Bump when the exported layout changes, so stale caches are rebuilt rather than trusted.
EXPORT_VERSION = 1
STALE_TMP_SECONDS = 3600  # a conversion takes seconds; older temporaries are from killed runs


def ensure_gguf_converted(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """Return the cached HF directory for ``gguf_path``, converting it on first use."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file {gguf_path} not found; give the path of an existing .gguf file")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / cache_key(gguf_path)
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    _convert_atomically(gguf_path, target)
    return target


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hetero"


def cache_key(gguf_path: Path) -> str:
    """Name of the cache folder: the GGUF's name and size, plus the export format version."""
    return f"{gguf_path.stem}-{gguf_path.stat().st_size}-v{EXPORT_VERSION}"


def _convert_atomically(gguf_path: Path, target: Path) -> None:
    from hetero_core.model import gguf_export

    _remove_stale_tmp_dirs(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        description = f"first use: converting {gguf_path.name} into {target} (once)"
        gguf_export.export_gguf(gguf_path, tmp, description)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary shared folder
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished first; its complete copy wins.
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_tmp_dirs(target: Path) -> None:
    """Delete temporaries that killed conversions left next to ``target`` (never a live one)."""
    cutoff = time.time() - STALE_TMP_SECONDS
    for tmp in target.parent.glob(f".{target.name}.*.tmp"):
        try:
            if tmp.stat().st_mtime < cutoff:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # another process removed it first
