"""Phi-3 over the engine's flat batch: the Llama decoder (its layers, norms, SwiGLU MLP and the
``CausalLM`` contract) with Phi-3's attention (rotary on the first ``rotary_dim`` channels of each
head) and Phi-3's rotary embedding (LongRoPE's short factors and attention factor). Parameter names
are the checkpoint's: ``self_attn.qkv_proj`` and ``mlp.gate_up_proj`` are fused there too.

Built on the building blocks ``hetero_core.architectures`` exports. Not a ``LlamaForCausalLM`` as far as the
CPU runtime is concerned: its linears are packed, its decode steps run this forward (the fused
decode kernel applies to the built-in Llama class only).
"""

from __future__ import annotations

import torch

from hetero_core.architectures import (
    AttentionBackend,
    KVCache,
    LlamaAttention,
    LlamaForCausalLM,
    apply_rotary,
)
from hetero_model_phi3.config import Phi3Config


class Phi3RotaryEmbedding:
    """``cos_sin(positions)`` ``[num_tokens, 1, rotary_dim // 2]`` each, scaled by the attention factor."""

    def __init__(self, config: Phi3Config):
        dim = config.rotary_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
        factors = torch.tensor(
            config.rope_short_factor or [1.0] * (dim // 2), dtype=torch.float32, device="cpu"
        )
        self.inv_freq = 1.0 / (factors * config.rope_theta**exponents)
        self.attention_factor = config.rope_attention_factor

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq
        if inv_freq.device != positions.device:
            inv_freq = inv_freq.to(positions.device)
        freqs = positions.float()[:, None, None] * inv_freq[None, None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


class Phi3Attention(LlamaAttention):
    def __init__(self, config: Phi3Config, backend: AttentionBackend):
        super().__init__(config, backend)
        self.rotary_dim = config.rotary_dim

    def forward(self, hidden, cos, sin, kv_cache: KVCache, attn_metadata, output_rows=None) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        num_qk = self.num_heads + self.num_kv_heads
        qk = qkv[:, :num_qk]
        if self.rotary_dim == self.head_dim:
            qk = apply_rotary(qk, cos, sin)
        else:  # only the first rotary_dim channels of each head turn
            qk = torch.cat(
                [apply_rotary(qk[..., : self.rotary_dim], cos, sin), qk[..., self.rotary_dim :]], dim=-1
            )
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        out = self.backend.forward(q, k, qkv[:, num_qk:], kv_cache, attn_metadata, self.scale)
        out = out.reshape(num_tokens, self.num_heads * self.head_dim)
        return self.o_proj(out if output_rows is None else out[output_rows])


class Phi3ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: Phi3Config, backend: AttentionBackend):
        super().__init__(config, backend)
        for layer in self.model.layers:
            layer.self_attn = Phi3Attention(config, backend)
        self.rotary = Phi3RotaryEmbedding(config)
