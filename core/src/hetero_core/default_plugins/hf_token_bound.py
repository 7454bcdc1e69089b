"""The most characters of input text one token of a tokenizer.json can stand for, when that is bounded.

The engine uses the bound (``Tokenizer.max_token_chars``) to refuse, without tokenizing, a text that
can never fit ``max_model_len``. It holds when no step of the pipeline can make text disappear: no
normalizer or only ones that never shorten the text, pre-tokenizers that split without removing,
and a BPE model that never fuses a run of unknown characters into one token. Then every token
covers at most as many input characters as its vocabulary string is long (byte-level BPE writes one
character per byte, never fewer than the characters). Anything else (WordPiece maps a whole unknown
word to one [UNK]; a whitespace pre-tokenizer drops spaces) gives None: no bound is claimed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["max_token_chars"]

KEEPING_PRE_TOKENIZERS = ("ByteLevel", "Metaspace", "Digits", "Punctuation", "Split", "UnicodeScripts")


def max_token_chars(spec: dict[str, Any], vocab: Iterable[str]) -> int | None:
    """``spec``: the parsed tokenizer.json; ``vocab``: every token string, added tokens included."""
    if not (
        _keeps_text(spec.get("normalizer"), _normalizer_keeps)
        and _keeps_text(spec.get("pre_tokenizer"), _pre_tokenizer_keeps)
        and _model_keeps(spec.get("model"))
    ):
        return None
    return max((len(token) for token in vocab), default=0) or None


def _keeps_text(step: Any, keeps) -> bool:
    if step is None:
        return True
    if not isinstance(step, dict):
        return False
    if step.get("type") == "Sequence":
        parts = step.get("normalizers", step.get("pretokenizers"))
        return isinstance(parts, list) and all(_keeps_text(p, keeps) for p in parts)
    return keeps(step)


def _normalizer_keeps(step: dict) -> bool:
    if step.get("type") == "Prepend":
        return True
    if step.get("type") == "Replace":  # one character into one or more: never shorter
        pattern, content = step.get("pattern"), step.get("content")
        return (
            isinstance(pattern, dict)
            and isinstance(pattern.get("String"), str)
            and len(pattern["String"]) == 1
            and isinstance(content, str)
            and len(content) >= 1
        )
    return False


def _pre_tokenizer_keeps(step: dict) -> bool:
    return step.get("type") in KEEPING_PRE_TOKENIZERS and step.get("behavior", "Isolated") != "Removed"


def _model_keeps(model: Any) -> bool:
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return False
    return not model.get("fuse_unk") or bool(model.get("byte_fallback"))
