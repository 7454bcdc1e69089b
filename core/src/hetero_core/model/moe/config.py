"""MoeConfig: what an HF config.json says about a model's experts, parsed once.

Field names differ by family: Qwen2-MoE and Qwen3-MoE give ``num_experts``, ``moe_intermediate_size``,
``norm_topk_prob``, ``decoder_sparse_step`` and ``mlp_only_layers`` (Qwen2-MoE adds a shared expert,
``shared_expert_intermediate_size``); Mixtral gives ``num_local_experts``, its experts are
``intermediate_size`` wide, every layer is sparse and the top-k weights are always renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_core.errors import ConfigError, ModelLoadError
from hetero_core.model.config import ModelConfig, parse_config

# Architecture name -> the dense family its attention follows (``ModelConfig.variant``).
MOE_ARCHITECTURES = {
    "Qwen3MoeForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2",
    "MixtralForCausalLM": "llama",
}


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int  # one expert's intermediate width
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1
    sparse_layers: tuple[int, ...]  # the decoder layers whose MLP is the experts (the others are dense)
    shared_expert_intermediate_size: int = 0  # 0: no shared expert (Qwen2-MoE has one, gated by a sigmoid)
    router_weights_fp32: bool = (
        False  # the top-k weights stay fp32 when applied (Mixtral); else the model's dtype
    )
    # Expert parallelism: this rank holds experts first_expert .. first_expert + num_local_experts - 1
    first_expert: int = 0
    num_local_experts: int | None = None  # None: every expert

    @property
    def local_experts(self) -> range:
        return range(self.first_expert, self.first_expert + (self.num_local_experts or self.num_experts))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], architecture: str, source: str = "config") -> MoeConfig:
        if architecture not in MOE_ARCHITECTURES:
            raise ModelLoadError(
                f"{architecture} is not a mixture-of-experts architecture; "
                f"supported: {', '.join(MOE_ARCHITECTURES)}"
            )
        try:
            num_layers = int(raw["num_hidden_layers"])
            if architecture == "MixtralForCausalLM":
                if raw.get("sliding_window") is not None:
                    raise ModelLoadError(
                        f"{source}: Mixtral with sliding_window {raw['sliding_window']} is not supported "
                        "(sliding-window attention); set sliding_window to null"
                    )
                moe = cls(
                    num_experts=int(raw["num_local_experts"]),
                    num_experts_per_tok=int(raw["num_experts_per_tok"]),
                    moe_intermediate_size=int(raw["intermediate_size"]),
                    norm_topk_prob=True,
                    sparse_layers=tuple(range(num_layers)),
                    router_weights_fp32=True,
                )
            else:
                num_experts = int(raw.get("num_experts", raw.get("num_local_experts", 0)))
                step = int(raw.get("decoder_sparse_step", 1))
                dense = set(raw.get("mlp_only_layers") or [])
                sparse = tuple(
                    i for i in range(num_layers) if i not in dense and num_experts > 0 and (i + 1) % step == 0
                )
                shared = (
                    int(raw.get("shared_expert_intermediate_size", 0))
                    if architecture == "Qwen2MoeForCausalLM"
                    else 0
                )
                moe = cls(
                    num_experts=num_experts,
                    num_experts_per_tok=int(raw["num_experts_per_tok"]),
                    moe_intermediate_size=int(raw["moe_intermediate_size"]),
                    norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                    sparse_layers=sparse,
                    shared_expert_intermediate_size=shared,
                )
        except KeyError as exc:
            raise ModelLoadError(
                f"{source}: missing required field {exc.args[0]!r} of {architecture}"
            ) from exc
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"{source}: invalid field value of {architecture} ({exc})") from exc
        if moe.sparse_layers and not 0 < moe.num_experts_per_tok <= moe.num_experts:
            raise ModelLoadError(
                f"{source}: num_experts_per_tok {moe.num_experts_per_tok} must be between 1 and "
                f"the number of experts ({moe.num_experts})"
            )
        return moe


@dataclass(frozen=True)
class MoeModelConfig(ModelConfig):
    """A ``ModelConfig`` (the attention, norms, RoPE and dense layers) with the experts' ``moe``."""

    moe: MoeConfig | None = None

    @property
    def variant(self) -> str:
        return MOE_ARCHITECTURES[self.architecture]


def moe_model_config(raw: dict[str, Any], source: str = "config") -> MoeModelConfig:
    """The ``config.json`` of a Qwen3-MoE, Qwen2-MoE or Mixtral model (its first ``architectures``
    name); sliding-window attention and activations other than SiLU are refused."""
    architecture = (raw.get("architectures") or ["<none given>"])[0]
    moe = MoeConfig.from_dict(raw, architecture, source)
    if raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or []):
        raise ModelLoadError(
            f"{source}: sliding-window attention is not supported; set use_sliding_window=false"
        )
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported; supported: silu")
    return parse_config(
        raw, source, MoeModelConfig, qk_norm=MOE_ARCHITECTURES[architecture] == "qwen3", moe=moe
    )


def check_expert_parallel(config: ModelConfig, size: int) -> None:
    """Refuse, in one line, a model without experts or a size that does not divide their number."""
    moe = getattr(config, "moe", None)
    if moe is None or not moe.sparse_layers:
        raise ConfigError(
            f"enable_expert_parallel needs a mixture-of-experts model; {config.architecture} has no "
            "experts (turn enable_expert_parallel off)"
        )
    if moe.num_experts % size:
        sizes = ", ".join(str(s) for s in range(1, moe.num_experts + 1) if moe.num_experts % s == 0)
        raise ConfigError(
            f"tensor_parallel_size {size} does not divide the model's {moe.num_experts} experts "
            f"(enable_expert_parallel; sizes that do: {sizes})"
        )
