"""Write a GGUF file out as a Hugging Face model directory (config, tokenizer, and fp32 safetensors
when asked: ``gguf_cache`` converts the weights only for a load that reads them).

The result loads like any HF checkpoint: our loader reads it in seconds, and the tokenizer files
(tokenizer.json, tokenizer_config.json with the chat template, special_tokens_map.json,
generation_config.json) work with ``AutoTokenizer`` or the bare ``tokenizers`` library. A byte-level
BPE tokenizer (Llama 3, Qwen, SmolLM2) is built from the GGUF's metadata as llama.cpp reads it
(``gguf_bpe_tokenizer``); a sentencepiece one goes through transformers' GGUF converter.
generation_config.json's ``eos_token_id`` lists every token that ends generation (``gguf_stop_tokens``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetero_core.errors import ModelLoadError
from hetero_core.model.gguf_bpe_tokenizer import save_byte_level_tokenizer
from hetero_core.model.gguf_checkpoint import field_value, gguf_config, gguf_state_dict, open_gguf
from hetero_core.model.gguf_stop_tokens import end_of_generation_ids
from hetero_core.model.progress import StepProgress

WEIGHTS_FILE = "model.safetensors"
# Keys transformers writes that describe the load call, not the tokenizer.
_DROPPED_TOKENIZER_KEYS = ("is_local", "local_files_only", "backend")


def export_gguf(gguf_path: Path, out_dir: Path, description: str | None = None, weights: bool = True) -> None:
    """Convert ``gguf_path`` into an HF directory at ``out_dir`` (which must exist and be empty), its
    weights too if ``weights``, showing progress on stderr (``description`` names the step; a bar on a
    terminal)."""
    from safetensors.torch import save_file

    reader = open_gguf(gguf_path)
    config = gguf_config(reader, gguf_path)
    has_tokenizer = field_value(reader, "tokenizer.ggml.model") is not None  # weights-only GGUFs have none
    # Steps: one per tensor, writing the weights, converting the tokenizer.
    total = (len(reader.tensors) + 1 if weights else 0) + 1 + int(has_tokenizer)
    with StepProgress(description or f"converting {gguf_path.name}", total) as progress:
        if weights:
            state = gguf_state_dict(reader, config, on_tensor=progress.advance)
            save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
            del state
            progress.advance()
        _write_json(out_dir / "config.json", config)
        _write_json(out_dir / "generation_config.json", _generation_config(reader))
        progress.advance()
        if has_tokenizer:
            export_tokenizer(
                gguf_path,
                out_dir,
                max_length=config["max_position_embeddings"],
                model_type=config["model_type"],
                reader=reader,
            )
            progress.advance()


def export_tokenizer(
    gguf_path: Path, out_dir: Path, max_length: int, model_type: str | None = None, reader=None
) -> None:
    """Save the GGUF's tokenizer files into ``out_dir``: a byte-level BPE one (``tokenizer.ggml.model``
    "gpt2") built here, any other through transformers. ``model_type``: the GGUF's architecture as
    ``gguf_config`` names it (``gguf_tokenizer_class``); ``reader``: the file already opened."""
    reader = reader if reader is not None else open_gguf(gguf_path)
    if field_value(reader, "tokenizer.ggml.model") == "gpt2":
        save_byte_level_tokenizer(reader, str(gguf_path), out_dir, max_length)
        return
    _export_through_transformers(gguf_path, out_dir, max_length, model_type)


def _export_through_transformers(
    gguf_path: Path, out_dir: Path, max_length: int, model_type: str | None
) -> None:
    """Save the GGUF's tokenizer through transformers, then make the files self-describing."""
    try:
        tokenizer_class = gguf_tokenizer_class(model_type)
    except ImportError as exc:
        raise ModelLoadError(
            "converting a GGUF tokenizer needs transformers; run: pip install transformers"
        ) from exc

    try:
        tokenizer = tokenizer_class.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:  # transformers raises many types for GGUF tokenizers it cannot convert
        raise ModelLoadError(
            f"cannot convert the tokenizer in {gguf_path}: {exc}; use the model's HF directory instead"
        ) from exc
    tokenizer.save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    tokenizer_config: dict[str, Any] = json.loads(config_path.read_text())
    for key in _DROPPED_TOKENIZER_KEYS:
        tokenizer_config.pop(key, None)
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config["model_max_length"] = max_length
    if tokenizer.chat_template:
        tokenizer_config["chat_template"] = tokenizer.chat_template
    _write_json(config_path, tokenizer_config)
    special = {
        name: getattr(tokenizer, name)
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if getattr(tokenizer, name, None) is not None
    }
    _write_json(out_dir / "special_tokens_map.json", special)


def gguf_tokenizer_class(model_type: str | None):
    """The transformers class that converts a GGUF's tokenizer: for a ``llama`` GGUF the one
    ``AutoTokenizer`` settles on there (transformers 5: ``TokenizersBackend``, the same files; test
    ``test_gguf_tokenizer_as_auto``), called directly because ``AutoTokenizer`` first builds the
    model's config through ``gguf.GGUFReader`` for architectures it has no fast reader for (5-15 s of a
    first start for the embedded model's 49k-token vocabulary); ``AutoTokenizer`` itself for other
    architectures and for transformers versions without that class."""
    if model_type == "llama":
        try:
            from transformers import TokenizersBackend
        except ImportError:
            pass
        else:
            return TokenizersBackend
    from transformers import AutoTokenizer

    return AutoTokenizer


def _generation_config(reader) -> dict[str, Any]:
    """The GGUF's BOS and pad ids, and as ``eos_token_id`` its EOS, or the list of every token that ends
    generation (its EOS first) where there are more."""
    config: dict[str, Any] = {}
    for name in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = field_value(reader, f"tokenizer.ggml.{name}")
        if value is not None:
            config[name.replace("padding_", "pad_")] = int(value)
    ends = end_of_generation_ids(reader)
    if len(ends) > 1:
        config["eos_token_id"] = ends
    return config


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
