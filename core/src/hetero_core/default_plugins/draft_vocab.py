"""The draft model must speak the target's token ids: refused at startup, in one line, when it does not.

Proposals are token ids, so what must agree is the id -> token mapping: the ``vocab`` of each model's
``tokenizer.json`` plus its added tokens. Where either directory has no ``tokenizer.json`` the models'
``vocab_size`` (their ``config.json``'s; without the target's, the engine's vocabulary) must agree instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from hetero_core.errors import ConfigError


def check_same_vocabulary(
    target_dir: Path | None, draft_dir: Path, target_vocab_size: int, draft_vocab_size: int
) -> None:
    """Raise ``ConfigError`` if the draft model's token ids mean something else than the target's."""
    target = _token_ids(target_dir) if target_dir is not None else None
    draft = _token_ids(draft_dir)
    if target is not None and draft is not None:
        if target != draft:
            diff = sorted(set(target.items()) ^ set(draft.items()))[:1]
            raise ConfigError(
                f"speculative_proposer draft: the draft model {draft_dir} has another tokenizer than "
                f"the target {target_dir} ({len(draft)} vs {len(target)} tokens; first difference "
                f"{diff[0] if diff else '?'}); "
                "give [speculative_proposer.draft] model a model of the target's tokenizer"
            )
        return
    target_vocab_size = _config_vocab_size(target_dir) or target_vocab_size
    if draft_vocab_size != target_vocab_size:
        raise ConfigError(
            f"speculative_proposer draft: the draft model {draft_dir} has vocab_size {draft_vocab_size}, "
            f"the target {target_vocab_size}; give [speculative_proposer.draft] model a model of the "
            "target's tokenizer"
        )


def _token_ids(model_dir: Path) -> dict[str, int] | None:
    """token -> id of ``model_dir/tokenizer.json`` (vocab and added tokens), or None without one."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"speculative_proposer draft: cannot read {path}: {exc}") from None
    vocab = data.get("model", {}).get("vocab") or {}
    if isinstance(vocab, list):  # unigram models: [[piece, score], ...]
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    ids = dict(vocab)
    ids.update({t["content"]: t["id"] for t in data.get("added_tokens", []) if "content" in t and "id" in t})
    return ids


def _config_vocab_size(model_dir: Path | None) -> int | None:
    """``vocab_size`` of ``model_dir/config.json``, or None without one."""
    path = None if model_dir is None else Path(model_dir) / "config.json"
    if path is None or not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None
