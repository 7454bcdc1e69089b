"""Convert a GGUF file once into a cached Hugging Face directory.

The conversion writes the config and tokenizer files only: the CPU executor with the compiled
kernels reads a GGUF's weights from the GGUF itself, as codes (``gguf_codes_loader``). A load that
needs fp32 weights in the folder (``read_checkpoint``: another device, ``block_code_weights = false``,
``quantization``...) converts them there on its first use (``check_converted_weights``), once.

The cache lives in ``$HETERO_CACHE_DIR`` or ``~/.cache/hetero``, one folder per GGUF (keyed by
its file name and size). Conversion writes into a temporary sibling that is swapped into place
(``folder_swap``, under the cache folder's lock: a whole copy another start returned is never moved),
so a killed conversion never leaves a half-written cache; temporaries it leaves behind are swept on
a later conversion. A manifest (``cache_file``) lists every file with its size and checksum and
the GGUF it came from: each start checks the small files (config, tokenizer: what every start
reads) and the weights' sizes, ``check_converted_weights`` checks the weights before they are read
(a start that maps its prepared weights never reads them). A damaged or manifest-less copy (an older
version's) is converted again, with one warning.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from hetero_core.cache import cache_file, folder_swap
from hetero_core.cache.cache_dir import default_cache_dir
from hetero_core.errors import ModelLoadError

# Bump when the exported layout changes, so stale caches are rebuilt rather than trusted.
# 2: the weights are converted only when a load needs them; 3: byte-level BPE tokenizers built from the
# GGUF's pre-tokenizer type (gguf_bpe_tokenizer), generation_config.json listing every end-of-turn token
EXPORT_VERSION = 3
STALE_TMP_SECONDS = 3600  # a conversion takes seconds; older temporaries are from killed runs


def ensure_gguf_converted(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """Return the cached HF directory for ``gguf_path``, converting it on first use and again when it
    is damaged (its small files are checked here; its weights where they are read)."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file {gguf_path} not found; give the path of an existing .gguf file")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / cache_key(gguf_path)
    if target.exists():
        try:
            _check(target, gguf_path, weights=False)
            return target
        except cache_file.CacheFileInvalid as exc:
            cache_file.warn_rebuilding(exc)
    root.mkdir(parents=True, exist_ok=True)
    _convert_atomically(gguf_path, target, again=target.exists())
    return target


def check_converted_weights(folder: Path) -> None:
    """Before a checkpoint's weights are read: for a converted GGUF (a folder with a manifest), its
    weight files are there (converted now if the folder has none yet) and match their checksums, or it
    is converted again (one warning). Any other folder: no check. ModelLoadError when it is damaged or
    has no weights and its GGUF is gone."""
    if not (folder / cache_file.MANIFEST).exists():
        return
    source = None
    try:
        manifest = cache_file.read_manifest(folder)
        source = Path(manifest.get("source", ""))
        weights = [name for name in manifest["files"] if name.endswith(".safetensors")]
        if not weights and gguf_source(folder) is not None:
            _convert_atomically(source, folder, weights=True)
            return
        if not weights:
            raise cache_file.CacheFileInvalid(folder, "no converted weights")
        cache_file.check_listed(folder, manifest, weights)
        return
    except cache_file.CacheFileInvalid as exc:
        error = exc
    if source is None or not source.is_file() or cache_key(source) != folder.name:
        raise ModelLoadError(
            f"the converted model {folder} is damaged ({error.problem}) and the GGUF it was "
            f"converted from is gone; delete {folder} and load the .gguf file again"
        )
    cache_file.warn_rebuilding(error)
    _convert_atomically(source, folder, again=True, weights=True)


def gguf_source(folder: Path) -> Path | None:
    """The GGUF a converted folder was converted from, where it is still there, the same file (name
    and size: ``cache_key``) and the folder is whole; None for any other folder."""
    try:
        manifest = cache_file.read_manifest(Path(folder))
    except (cache_file.CacheFileInvalid, OSError):
        return None
    source = Path(manifest.get("source", ""))
    if not source.is_file() or cache_key(source) != Path(folder).name:
        return None
    return source


def cache_key(gguf_path: Path) -> str:
    """Name of the cache folder: the GGUF's name and size, plus the export format version."""
    return f"{gguf_path.stem}-{gguf_path.stat().st_size}-v{EXPORT_VERSION}"


def _check(folder: Path, gguf_path: Path, *, weights: bool) -> None:
    """``folder`` is the whole conversion of ``gguf_path`` (CacheFileInvalid otherwise); its weights'
    checksums are checked only if ``weights`` (their sizes always)."""
    manifest = cache_file.read_manifest(folder)
    if manifest.get("gguf") != [gguf_path.name, gguf_path.stat().st_size]:
        raise cache_file.CacheFileInvalid(
            folder, f"converted from {manifest.get('gguf')}, not {gguf_path.name}"
        )
    names = list(manifest["files"])
    checked = names if weights else [name for name in names if not name.endswith(".safetensors")]
    cache_file.check_listed(folder, manifest, names, checked)


def _convert_atomically(gguf_path: Path, target: Path, again: bool = False, weights: bool = False) -> None:
    """Convert into a temporary sibling (with the fp32 weights if ``weights``), list it in its manifest,
    and move it to ``target`` (over a damaged copy there, or one without the weights asked for: renamed
    away first, then deleted)."""
    from hetero_core.model import gguf_export

    _remove_stale_tmp_dirs(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        if again:
            description = f"converting {gguf_path.name} into {target} again (the cached copy is damaged)"
        elif weights:
            description = f"converting the weights of {gguf_path.name} to fp32 into {target} (once)"
        else:
            description = f"first use: converting {gguf_path.name} into {target} (once)"
        gguf_export.export_gguf(gguf_path, tmp, description, weights=weights)
        cache_file.write_manifest(
            tmp, gguf=[gguf_path.name, gguf_path.stat().st_size], source=str(gguf_path.resolve())
        )
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary shared folder
        _move_into_place(tmp, target, gguf_path, weights)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(tmp: Path, target: Path, gguf_path: Path, weights: bool) -> None:
    """``tmp`` replaces ``target`` unless another process already put a whole copy there (the decision
    is taken under the cache folder's lock, so a whole copy another start returned is never moved)."""
    with folder_swap.exclusive(target.parent):
        if not _is_whole(target, gguf_path, weights):
            folder_swap.swap_in(tmp, target)


def _is_whole(folder: Path, gguf_path: Path, weights: bool = False) -> bool:
    """``folder`` is an undamaged conversion of ``gguf_path`` (with weights, if ``weights``)."""
    try:
        _check(folder, gguf_path, weights=True)
        listed = cache_file.read_manifest(folder)["files"]
        return not weights or any(name.endswith(".safetensors") for name in listed)
    except (cache_file.CacheFileInvalid, OSError):
        return False


def _remove_stale_tmp_dirs(target: Path) -> None:
    """Delete temporaries that killed conversions left next to ``target`` (never a live one)."""
    cutoff = time.time() - STALE_TMP_SECONDS
    for tmp in target.parent.glob(f".{target.name}.*.tmp"):
        try:
            if tmp.stat().st_mtime < cutoff:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # another process removed it first
