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
from torch.nn import functional as F

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import KVCache
from hetero_core.model.layers import RMSNorm, SwiGLU
from hetero_core.model.moe.experts import Experts
from hetero_core.model.mla.attention import MLAAttention
from hetero_core.model.mla.config import MLAConfig
from hetero_core.model.mla.moe import DeepseekMoE
from hetero_core.model.mla.rope import DeepseekRotary


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: MLAConfig, backend: Any, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.is_moe_layer(index):
            moe = config.moe
            width = int(moe["moe_intermediate_size"])
            shared = SwiGLU(config.hidden_size, width * int(moe.get("n_shared_experts") or 0), config.mlp_bias)
            experts = Experts(int(moe["n_routed_experts"]), config.hidden_size, width)
            self.mlp = DeepseekMoE(config, shared, experts)
        else:
            self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def forward(self, hidden, residual, cos, sin, kv_cache: KVCache, attn_metadata: Any,
                output_rows: torch.Tensor | None = None):
        """As ``LlamaDecoderLayer.forward``: ``(hidden, residual) -> (hidden, residual)``."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, kv_cache, attn_metadata, output_rows)
        if output_rows is not None:
            residual = residual[output_rows]
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DeepseekModel(nn.Module):
    def __init__(self, config: MLAConfig, backend: Any):
        super().__init__()
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(DeepseekDecoderLayer(config, backend, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekForCausalLM(nn.Module):
    """``forward(...) -> hidden [num_tokens, hidden]`` (or the ``output_rows``' rows); ``compute_logits``."""

    def __init__(self, config: MLAConfig, backend: Any):
        super().__init__()
        if backend is not None and not hasattr(backend, "forward_latent"):  # None: weights only
            raise ModelLoadError(f"attention backend {getattr(backend, 'name', type(backend).__name__)!r} has no "
                                 "latent-attention path (forward_latent) for MLA; use the torch executor")
        self.config = config
        self.backend = backend
        self.model = DeepseekModel(config, backend)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.rotary = DeepseekRotary(config)
        self.fused_decode = None  # no fused CPU decode step for MLA (the Llama one's layout differs)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any,
                kv_caches: list[KVCache], output_rows: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)
        residual = None
        last = len(self.model.layers) - 1
        for index, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            rows = output_rows if index == last else None
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, attn_metadata, rows)
        if residual is None:
            hidden = self.model.norm(hidden)
            return hidden if output_rows is None else hidden[output_rows]
        return self.model.norm(hidden, residual)[0]

    def sampled_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any,
                       kv_caches: list[KVCache], rows: torch.Tensor | None) -> torch.Tensor:
        """As ``LlamaForCausalLM.sampled_logits``: logits of the flat rows ``rows`` (None: every row)."""
        return self.compute_logits(self(input_ids, positions, attn_metadata, kv_caches, output_rows=rows))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(hidden, self.model.embed_tokens.weight)
        return self.lm_head(hidden)

    def untie_lm_head(self) -> None:
        """Give tied embeddings an ``lm_head`` module sharing their weight (so weight packing sees it)."""
        if self.lm_head is None:
            weight = self.model.embed_tokens.weight
            with torch.device("meta"):
                self.lm_head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            self.lm_head.weight = weight
