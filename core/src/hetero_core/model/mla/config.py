"""MLAConfig: a DeepSeek-V2/V3 ``config.json`` as the MLA model code reads it.

Multi-head latent attention (MLA) caches one compressed latent per token (``kv_lora_rank`` values)
plus one RoPE key (``qk_rope_head_dim``) shared by every head, instead of per-head K and V.
What this model code cannot run faithfully is a ``ModelLoadError`` naming the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetero_core.errors import ModelLoadError
from hetero_core.model.config import ModelConfig

MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
MLA_ROPE_TYPES = ("default", "yarn")


@dataclass(frozen=True)
class MLAConfig(ModelConfig):
    """``ModelConfig``'s fields (``num_key_value_heads`` = heads and ``head_dim`` = the RoPE width, as
    transformers sets them; the MLA code reads neither) and MLA's own."""

    q_lora_rank: int | None = None  # None: one q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
    kv_lora_rank: int = 512  # the latent's width (what the cache stores per token, with the RoPE key)
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_interleave: bool = True  # RoPE over adjacent pairs (DeepSeek's layout); False: rotate-half
    first_k_dense_replace: int = 0  # layers before this index are dense MLPs, the rest MoE
    num_nextn_predict_layers: int = 0  # V3's multi-token-prediction layers after the last one (not run)
    moe: dict[str, Any] = field(default_factory=dict)  # the MoE fields as the config gives them

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values cached per token per layer: the latent and the RoPE key (576 in DeepSeek-V2)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def mha_kv_dim(self) -> int:
        """Values the same model with plain MHA would cache per token per layer (K and V of every head)."""
        return self.num_attention_heads * (self.qk_head_dim + self.v_head_dim)

    def is_moe_layer(self, index: int) -> bool:
        return bool(self.moe.get("n_routed_experts")) and index >= self.first_k_dense_replace

    @property
    def has_moe_layers(self) -> bool:
        return any(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> MLAConfig:
        names = [n for n in raw.get("architectures") or [] if n in MLA_ARCHITECTURES]
        if not names:
            raise ModelLoadError(
                f"{source}: not an MLA architecture; supported: {', '.join(MLA_ARCHITECTURES)}"
            )
        try:
            if raw.get("hidden_act", "silu") not in ("silu", "swish"):
                raise ModelLoadError(
                    f"{source}: hidden_act {raw['hidden_act']!r} is not supported; supported: silu"
                )
            num_heads = int(raw["num_attention_heads"])
            rope_theta, rope_scaling = _rope(raw, source)
            q_lora_rank = raw.get("q_lora_rank")
            config = cls(
                architecture=names[0],
                hidden_size=int(raw["hidden_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=num_heads,
                num_key_value_heads=num_heads,
                head_dim=int(raw["qk_rope_head_dim"]),
                q_lora_rank=None if q_lora_rank is None else int(q_lora_rank),
                kv_lora_rank=int(raw["kv_lora_rank"]),
                qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
                qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
                v_head_dim=int(raw["v_head_dim"]),
                intermediate_size=int(raw["intermediate_size"]),
                vocab_size=int(raw["vocab_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                # DeepSeek-V2 always rotates adjacent pairs; V3 says so in rope_interleave (default True)
                rope_interleave=names[0] == "DeepseekV2ForCausalLM" or bool(raw.get("rope_interleave", True)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                attention_bias=bool(raw.get("attention_bias", False)),
                mlp_bias=bool(raw.get("mlp_bias", False)),
                first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
                num_nextn_predict_layers=int(raw.get("num_nextn_predict_layers") or 0),
                moe={key: raw.get(key) for key in _MOE_FIELDS},
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=_as_tuple(raw.get("eos_token_id")),
            )
        except KeyError as exc:
            raise ModelLoadError(f"{source}: missing required field {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(
                f"{source}: invalid field value ({exc}); is this a Hugging Face config.json?"
            ) from exc
        missing = [
            key for key in ("num_experts_per_tok", "moe_intermediate_size") if config.moe.get(key) is None
        ]
        if config.has_moe_layers and missing:
            raise ModelLoadError(
                f"{source}: layers from first_k_dense_replace = {config.first_k_dense_replace} on are "
                f"mixtures of experts (n_routed_experts = {config.moe['n_routed_experts']}) but "
                f"{', '.join(missing)} is not set"
            )
        return config


_MOE_FIELDS = (
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "topk_method",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "norm_topk_prob",
    "scoring_func",
)


def _rope(raw: dict[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, yarn parameters or None) from either spelling (``rope_parameters`` / ``rope_scaling``)."""
    params = dict(raw.get("rope_parameters") or {})
    legacy = dict(raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = params or legacy
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in MLA_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope type {rope_type!r} is not supported for MLA; "
            f"supported: {', '.join(MLA_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    scaling = {**scaling, "rope_type": "yarn"}
    scaling.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings", 2048))
    if scaling.get("factor") is None:  # as transformers: the ratio of the context lengths
        scaling["factor"] = (
            raw.get("max_position_embeddings", 2048) / scaling["original_max_position_embeddings"]
        )
    return theta, scaling


def _as_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)
