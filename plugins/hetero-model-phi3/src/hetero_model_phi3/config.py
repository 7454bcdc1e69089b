"""Phi-3's ``config.json``: the Llama fields plus partial rotary embeddings and LongRoPE.

- ``partial_rotary_factor`` (Phi-4-mini: 0.75): only the first ``rotary_dim`` channels of each head
  are rotated.
- LongRoPE (``rope_type`` "longrope"; "su" and "yarn" are read as longrope, as transformers' Phi-3
  does): per-frequency ``short_factor``s and the attention factor (``sqrt(1 + ln(s) / ln(L))`` for
  ``s = max_position_embeddings / original_max_position_embeddings``, unless given) scale the
  rotation. The ``long_factor``s apply to whole sequences longer than ``original_max_position_embeddings``
  (transformers switches every position of such a sequence, cached ones included); that is not run
  here: the context is capped at ``original_max_position_embeddings``.
- ``sliding_window`` W: not implemented by the attention backends, so the context is capped at W
  tokens, where full attention is the same.
Anything else (another ``rope_type``, an activation other than SiLU) is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hetero_core import ModelLoadError
from hetero_core.architectures import ModelConfig, parse_config

ROPE_TYPES = ("default", "longrope")
_LONGROPE_ALIASES = ("su", "yarn")


@dataclass(frozen=True)
class Phi3Config(ModelConfig):
    rotary_dim: int = 0  # channels of each head that are rotated (head_dim * partial_rotary_factor)
    rope_short_factor: tuple[float, ...] | None = None  # LongRoPE: divides each inverse frequency
    rope_attention_factor: float = 1.0  # LongRoPE: scales cos and sin
    sliding_window: int | None = None


def phi3_config(raw: dict[str, Any], source: str = "config") -> Phi3Config:
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported; supported: silu")
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    rope_type = "longrope" if rope_type in _LONGROPE_ALIASES else rope_type
    if rope_type not in ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: Phi-3 rope_type {rope_type!r} is not supported; supported: "
            f"{', '.join(ROPE_TYPES)} (and su, yarn as longrope)"
        )
    plain = {k: v for k, v in raw.items() if k not in ("rope_parameters", "rope_scaling")}
    base = parse_config({**plain, "rope_theta": theta}, source)
    rotary_dim = int(
        base.head_dim * float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    )
    if rotary_dim % 2 or not 0 < rotary_dim <= base.head_dim:
        raise ModelLoadError(
            f"{source}: partial_rotary_factor gives {rotary_dim} rotated channels of "
            f"{base.head_dim}; it must be an even number"
        )
    limit = base.max_position_embeddings
    fields: dict[str, Any] = {}
    if rope_type == "longrope":
        fields, limit = _longrope(rope, raw, base.max_position_embeddings, rotary_dim, source)
    window = raw.get("sliding_window")
    if window is not None:
        limit = min(limit, int(window))
    return parse_config(
        {**plain, "rope_theta": theta},
        source,
        Phi3Config,
        rotary_dim=rotary_dim,
        max_position_embeddings=limit,
        sliding_window=None if window is None else int(window),
        **fields,
    )


def _longrope(rope: dict, raw: dict, max_positions: int, rotary_dim: int, source: str) -> tuple[dict, int]:
    """The short factors and attention factor, and the context limit (the original one)."""
    original = rope.get("original_max_position_embeddings", raw.get("original_max_position_embeddings"))
    short = rope.get("short_factor")
    if original is None or short is None:
        raise ModelLoadError(f"{source}: longrope needs short_factor and original_max_position_embeddings")
    if len(short) != rotary_dim // 2:
        raise ModelLoadError(
            f"{source}: longrope short_factor has {len(short)} entries; {rotary_dim // 2} "
            "(rotated channels / 2) expected"
        )
    factor = rope.get("factor") or max_positions / int(original)
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(int(original)))
    fields = {"rope_short_factor": tuple(float(x) for x in short), "rope_attention_factor": float(attention)}
    return fields, min(max_positions, int(original))
