"""DeepSeek-V2/V3 (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``) over the engine's flat batch.

The same contract as ``hetero_core.model.llama.LlamaForCausalLM``: ``forward(input_ids, positions,
attn_metadata, kv_caches, output_rows)``, ``sampled_logits``, ``compute_logits``; parameter names are
Hugging Face's. Attention is multi-head latent attention (``mla.attention``); the MLP of a layer is
dense (``first_k_dense_replace``) or a mixture of experts. Dense MLPs and the shared experts run
gate and up as one ``gate_up_proj`` matmul (``layers.SwiGLU``; the weight mapping concatenates them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero_core.errors import ModelLoadError
from hetero_core.model.layers import RMSNorm, SwiGLU
from hetero_core.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from hetero_core.model.mla.attention import MLAAttention
from hetero_core.model.mla.config import MLAConfig
from hetero_core.model.mla.moe import DeepseekMoE
from hetero_core.model.mla.rope import DeepseekRotary
from hetero_core.model.moe.experts import Experts


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: MLAConfig, backend: Any, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.is_moe_layer(index):
            moe = config.moe
            width = int(moe["moe_intermediate_size"])
            shared = SwiGLU(
                config.hidden_size, width * int(moe.get("n_shared_experts") or 0), config.mlp_bias
            )
            experts = Experts(int(moe["n_routed_experts"]), config.hidden_size, width)
            self.mlp = DeepseekMoE(config, shared, experts)
        else:
            self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)

    forward = LlamaDecoderLayer.forward  # pre-norm residual layer, the same wiring as Llama's


class DeepseekModel(nn.Module):
    def __init__(self, config: MLAConfig, backend: Any):
        super().__init__()
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(
            DeepseekDecoderLayer(config, backend, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekForCausalLM(nn.Module):
    """``forward(...) -> hidden [num_tokens, hidden]`` (or the ``output_rows``' rows); ``compute_logits``."""

    def __init__(self, config: MLAConfig, backend: Any):
        super().__init__()
        if backend is not None and not hasattr(backend, "forward_latent"):  # None: weights only
            raise ModelLoadError(
                f"attention backend {getattr(backend, 'name', type(backend).__name__)!r} has no "
                "latent-attention path (forward_latent) for MLA; use the torch executor"
            )
        self.config = config
        self.backend = backend
        self.model = DeepseekModel(config, backend)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rotary = DeepseekRotary(config)
        self.fused_decode = None  # no fused CPU decode step for MLA (the Llama one's layout differs)
        self.pipeline = None  # MLA does not declare pipeline_parallel: always the whole model

    # The same forward and head as Llama's (``fused_decode`` stays None: no fused CPU decode step).
    forward = LlamaForCausalLM.forward
    sampled_logits = LlamaForCausalLM.sampled_logits
    compute_logits = LlamaForCausalLM.compute_logits
    untie_lm_head = LlamaForCausalLM.untie_lm_head
