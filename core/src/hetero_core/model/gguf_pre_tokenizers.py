"""How llama.cpp splits text before byte-level BPE, for each ``tokenizer.ggml.pre`` Hetero knows.

A GGUF names its pre-tokenizer by a short type (``llama-bpe``, ``qwen2``, ``smollm``...) instead of
carrying tokenizer.json's pre-tokenizer. The merges were learned on text split one particular way,
so a wrong split gives other token ids than the model was trained on (llama.cpp warns that
"generation quality will be degraded"). The facts below are llama.cpp's (``src/llama-vocab.cpp``:
the regexes each type applies, in order, and the flags it sets for the type), written with the
regexes of the models' own tokenizer.json where llama.cpp lists them; each family is tested on its
real vocabulary against llama.cpp's token ids (tests/model/test_gguf_tokenizers.py).

A type outside this table is refused in one line (``pre_tokenizer_family``): guessing a split would
quietly tokenize differently from the model's training.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_core.errors import ModelLoadError

__all__ = ["PreTokenizerFamily", "known_pre_types", "pre_tokenizer_family"]


@dataclass(frozen=True)
class PreTokenizerFamily:
    """``splits``: regexes applied one after another, each keeping both its matches and the text
    between them as pieces (llama.cpp's ``unicode_regex_split``; tokenizers' ``Split`` "isolated").
    ``ignore_merges``: a piece that is itself a vocabulary entry is one token, without merging
    (Llama 3's tokenizer.json sets it too). ``add_bos``: llama.cpp's default for
    ``tokenizer.ggml.add_bos_token`` when the file does not say."""

    splits: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


# Llama 3's tokenizer.json pattern (llama.cpp spells the (?i:...) group out, the same matches).
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's: Llama 3's with single digits.
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5's: Qwen2's with combining marks kept with the letters they follow.
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-2's pattern (tokenizers' ByteLevel regex), after every digit is split off on its own.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_LLAMA3_FAMILY = PreTokenizerFamily((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_FAMILY = PreTokenizerFamily((_QWEN2,))

FAMILIES: dict[str, PreTokenizerFamily] = {
    "llama3": _LLAMA3_FAMILY,
    "llama-v3": _LLAMA3_FAMILY,
    "llama-bpe": _LLAMA3_FAMILY,  # what llama.cpp's converter writes for Llama 3.x
    "qwen2": _QWEN2_FAMILY,  # Qwen2, Qwen2.5 and Qwen3
    "deepseek-r1-qwen": _QWEN2_FAMILY,  # DeepSeek-R1's distills into Qwen2.5
    "qwen35": PreTokenizerFamily((_QWEN35,)),
    "smollm": PreTokenizerFamily((r"\p{N}", _GPT2)),  # SmolLM and SmolLM2
}


def known_pre_types() -> list[str]:
    return sorted(FAMILIES)


def pre_tokenizer_family(pre_type: str | None, source: str) -> PreTokenizerFamily:
    """The family of ``pre_type`` (a GGUF's ``tokenizer.ggml.pre``); ModelLoadError naming it, the known
    types and the way out when Hetero does not know it (``source``: the file, for the message)."""
    family = FAMILIES.get(pre_type or "")
    if family is None:
        what = f"pre-tokenizer type {pre_type!r}" if pre_type else "no pre-tokenizer type"
        raise ModelLoadError(
            f"{source}: its byte-level BPE tokenizer has {what} (tokenizer.ggml.pre), which Hetero "
            f"does not know (known: {', '.join(known_pre_types())}); load the model's HF directory instead"
        )
    return family
