"""Phi-3 (``Phi3ForCausalLM``) for Hetero, as an outside package: one ``register_model_architectures``
hook. The module imports no torch; the model code loads when a Phi-3 checkpoint does."""

from __future__ import annotations

from hetero_core import hookimpl
from hetero_core.architectures import ModelArchitecture, same_kv_layout
from hetero_model_phi3.config import Phi3Config, phi3_config

__all__ = ["PHI3", "Phi3Config", "phi3_config", "register_model_architectures"]


def _build(config: Phi3Config, backend):
    from hetero_model_phi3.model import Phi3ForCausalLM

    return Phi3ForCausalLM(config, backend)


def _bench_config() -> dict:
    """~150M parameters, Phi-3's proportions (MHA, no KV grouping), for ``hetero bench models``."""
    return {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
        "intermediate_size": 2048,
        "vocab_size": 32064,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 32000,
    }


# The checkpoint already holds q/k/v as one qkv_proj and gate/up as one gate_up_proj, as the module
# does: the default (identity) weight mapping. Its fused q/k/v rows cannot be cut the Llama way, so
# no tensor parallelism.
PHI3 = ModelArchitecture(
    config=phi3_config,
    build=_build,
    kv_layout=same_kv_layout,
    tensor_parallel=False,
    bench_config=_bench_config,
    hf_class="Phi3ForCausalLM",
)


@hookimpl
def register_model_architectures(register):
    register("Phi3ForCausalLM", PHI3)
