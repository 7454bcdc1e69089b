"""A GGUF's byte-level BPE tokenizer (``tokenizer.ggml.model = "gpt2"``: Llama 3, Qwen2/2.5/3,
SmolLM2) built as a ``tokenizers.Tokenizer`` from the file's own metadata, the way llama.cpp reads it.

transformers' GGUF converter gets these wrong in ways that change token ids: it leaves out Llama 3's
``ignore_merges`` (a word that is a vocabulary entry is one token), SmolLM's single-digit split and the
BOS llama.cpp adds for Llama 3, and adds a ``<|endoftext|>`` of its own. So these are built here:

- the vocabulary and merges as the file lists them (ids are the list's positions);
- the pre-tokenizer of the file's ``tokenizer.ggml.pre`` (``gguf_pre_tokenizers``), then the
  byte-to-character mapping (ByteLevel), and ByteLevel decoding back to bytes;
- the tokens the file types as control (3) as special tokens (matched whole in text, left out when
  decoding by default) and those typed user-defined (4) as added, non-special tokens (matched whole,
  decoded as text): llama.cpp's handling of both, and tokenizer.json's ``added_tokens``;
- BOS and EOS added to plain text as ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say, else as
  llama.cpp's default for the pre-tokenizer type (BOS for Llama 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_core.errors import ModelLoadError
from hetero_core.model.gguf_checkpoint import field_value, named_token_id
from hetero_core.model.gguf_pre_tokenizers import pre_tokenizer_family

__all__ = ["BPETokenizerParts", "byte_level_bpe_tokenizer", "save_byte_level_tokenizer"]

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)
# tokenizer_config.json's names of the tokens a GGUF names (tokenizer.ggml.<key>_token_id).
NAMED_TOKENS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
MERGES = "tokenizer.ggml.merges"


@dataclass(frozen=True)
class BPETokenizerParts:
    """The built tokenizer and what the tokenizer files say beside it."""

    tokenizer: object  # tokenizers.Tokenizer
    add_bos: bool
    add_eos: bool


def byte_level_bpe_tokenizer(reader, source: str) -> BPETokenizerParts:
    """The tokenizer of a GGUF whose ``tokenizer.ggml.model`` is ``gpt2`` (``reader``: its fields, as
    ``open_gguf`` reads them; ``source`` names the file in errors). ModelLoadError for a pre-tokenizer
    type Hetero does not know."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    family = pre_tokenizer_family(field_value(reader, "tokenizer.ggml.pre"), source)
    tokens = list(field_value(reader, "tokenizer.ggml.tokens"))
    types = list(field_value(reader, "tokenizer.ggml.token_type", ()))
    merges = [
        _merge_pair(merge, index, source) for index, merge in enumerate(field_value(reader, MERGES, ()))
    ]
    vocab = {token: index for index, token in enumerate(tokens)}
    try:
        model = models.BPE(vocab=vocab, merges=merges, ignore_merges=family.ignore_merges, fuse_unk=False)
    except Exception as exc:  # tokenizers raises a bare Exception for a merge of an unknown token
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(
            f"{source}: its tokenizer's merges ({MERGES}) do not fit its vocabulary: {problem}"
        ) from exc
    tokenizer = Tokenizer(model)
    splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in family.splits]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    typed = list(zip(tokens, types))
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token, kind in typed if kind == CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(token, special=False, normalized=False) for token, kind in typed if kind == USER_DEFINED]
    )
    add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", family.add_bos))
    add_eos = bool(field_value(reader, "tokenizer.ggml.add_eos_token", False))
    add_bos = add_bos and named_token_id(reader, "bos", len(tokens)) is not None
    add_eos = add_eos and named_token_id(reader, "eos", len(tokens)) is not None
    if add_bos or add_eos:
        tokenizer.post_processor = _bos_eos_template(reader, tokens, add_bos, add_eos)
    return BPETokenizerParts(tokenizer, add_bos, add_eos)


def save_byte_level_tokenizer(reader, source: str, out_dir: Path, max_length: int) -> None:
    """Write the tokenizer as an HF model directory's files (tokenizer.json, tokenizer_config.json
    with the chat template, special_tokens_map.json), which the hf tokenizer and transformers read."""
    parts = byte_level_bpe_tokenizer(reader, source)
    parts.tokenizer.save(str(out_dir / "tokenizer.json"))
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    special = {
        name: tokens[index]
        for name, key in NAMED_TOKENS.items()
        if (index := named_token_id(reader, key, len(tokens))) is not None
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "add_bos_token": parts.add_bos,
        "add_eos_token": parts.add_eos,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    template = chat_templates(reader)
    if template is not None:
        config["chat_template"] = template
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", special)


def chat_templates(reader) -> str | list[dict[str, str]] | None:
    """``tokenizer.chat_template``; with named ones beside it (``tokenizer.chat_template.<name>``, e.g.
    tool_use), tokenizer_config.json's list form, the unnamed one as "default"."""
    default = field_value(reader, CHAT_TEMPLATE_KEY)
    named = [
        {"name": key[len(CHAT_TEMPLATE_KEY) + 1 :], "template": field_value(reader, key)}
        for key in reader.fields
        if key.startswith(CHAT_TEMPLATE_KEY + ".")
    ]
    if not named:
        return default or None
    return ([{"name": "default", "template": default}] if default else []) + named


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _merge_pair(merge: str, index: int, source: str) -> tuple[str, str]:
    """A merge's two tokens: split at its first space after the first character, as llama.cpp splits."""
    position = merge.find(" ", 1)
    if position == -1:
        raise ModelLoadError(
            f"{source}: merge {index} of its tokenizer ({MERGES}) is {merge!r}, not two tokens"
        )
    return merge[:position], merge[position + 1 :]


def _bos_eos_template(reader, tokens: list[str], add_bos: bool, add_eos: bool):
    from tokenizers import processors

    bos, eos = named_token_id(reader, "bos", len(tokens)), named_token_id(reader, "eos", len(tokens))
    before = [f"{tokens[bos]}:0"] if add_bos else []
    after = [f"{tokens[eos]}:0"] if add_eos else []
    named = {tokens[i]: i for i, wanted in ((bos, add_bos), (eos, add_eos)) if wanted}
    return processors.TemplateProcessing(
        single=[*before, "$A:0", *after],
        pair=[*before, "$A:0", *after, *before, "$B:1", *after],
        special_tokens=list(named.items()),
    )
