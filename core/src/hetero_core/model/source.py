"""Where a model's files are: a local HF directory or ``.gguf`` file, or a hub id downloaded once.

Imports no torch: the builder resolves the model before the executor's factory runs, and the torch
executor's CPU path chooses OpenMP's wait policy there, before torch loads (``cpu/threads.py``).
"""

from __future__ import annotations

from pathlib import Path

from hetero_core.errors import ModelLoadError

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]


def resolve_model_source(source: str | Path) -> Path:
    """A local path (HF directory or ``.gguf`` file) for ``source``; downloads hub ids."""
    path = Path(source).expanduser()
    if path.exists():
        return path
    text = str(source)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return download_from_hub(text)
    raise ModelLoadError(
        f"model {text!r} not found; give a local HF directory, a .gguf file, or a hub id like 'org/name'"
    )


def download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ModelLoadError(
            f"loading {repo_id!r} from the hub needs huggingface_hub; run: pip install huggingface_hub"
        ) from exc
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # network, auth and missing-repo errors all land here
        raise ModelLoadError(
            f"cannot download {repo_id!r} from the hub: {exc}; download it and pass the directory"
        ) from exc
