"""The Llama family (Llama, Qwen2, Qwen3) over the engine's flat batch.

Every tensor has the scheduled tokens of a step as its first dimension (``[num_tokens, ...]``, no
padding). Attention goes through the ``AttentionBackend`` handed to the model, with the metadata
the backend built for this step. Parameter names match Hugging Face checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hetero_core.model.attention import AttentionBackend, KVCache
from hetero_core.model.config import ModelConfig
from hetero_core.model.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.backend = backend
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden = config.hidden_size
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(hidden, q_size + 2 * kv_size, bias=config.qkv_bias)  # q, k, v (see fusion)
        self.o_proj = nn.Linear(q_size, hidden, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.kernels = None  # the compiled CPU kernels (RoPE in place), see layers.use_cpu_kernels

    def forward(
        self, hidden, cos, sin, kv_cache: KVCache, attn_metadata: Any, output_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``output_rows``: only these rows of the output are needed (every row's K/V is still
        written): the output projection runs on them alone."""
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        num_qk = self.num_heads + self.num_kv_heads
        if self.q_norm is None and self.kernels is not None and self.kernels.handles(qkv, self.head_dim // 2):
            self.kernels.rotary_(qkv[:, :num_qk], cos, sin)  # the projection's own output, rotated in place
            q, k = qkv[:, : self.num_heads], qkv[:, self.num_heads : num_qk]
        elif self.q_norm is None:  # q and k are adjacent: rotate both in one pass
            qk = apply_rotary(qkv[:, :num_qk], cos, sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        else:
            q = apply_rotary(self.q_norm(qkv[:, : self.num_heads]), cos, sin)
            k = apply_rotary(self.k_norm(qkv[:, self.num_heads : num_qk]), cos, sin)
        out = self.backend.forward(q, k, qkv[:, num_qk:], kv_cache, attn_metadata, self.scale)
        out = out.reshape(num_tokens, self.num_heads * self.head_dim)
        return self.o_proj(out if output_rows is None else out[output_rows])


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    def forward(
        self,
        hidden,
        residual,
        cos,
        sin,
        kv_cache: KVCache,
        attn_metadata: Any,
        output_rows: torch.Tensor | None = None,
    ):
        """``(hidden, residual) -> (hidden, residual)``: the layer's output is their sum, left
        unadded so the next norm adds it in the same pass (``residual`` is None for the first layer).
        ``output_rows``: the output only for these rows (after attention, which writes every row's
        K/V, the rest of the layer runs on them alone)."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, kv_cache, attn_metadata, output_rows)
        if output_rows is not None:
            residual = residual[output_rows]
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        # Loading assigns every weight, so the table gets no random init: on the meta device
        # nn.Embedding's normal_ init would import torch._dynamo (~1.5 s of a warm start).
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, backend) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """``forward(input_ids, positions, attn_metadata, kv_caches) -> hidden [num_tokens, hidden]``;
    ``compute_logits(hidden_rows) -> [rows, vocab]`` only for the rows that are sampled.
    ``forward(..., output_rows=rows)`` returns only those rows' hidden states ([len(rows), hidden]):
    the last layer's output projection and MLP then run on them alone (a prefill samples one row of
    its prompt: ~2.5 % less work for a 30-layer model), every row's K/V is still written.

    A pipeline stage (``pipeline``, a ``pipeline_stage.StageLink``, set by the loader) holds only its
    layers: a later stage receives the previous stage's ``(hidden, residual)`` instead of embedding
    the tokens, and an earlier one sends its own on and returns ``[rows, 0]`` (no logits: the last
    stage has them)."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.backend = backend
        self.model = LlamaModel(config, backend)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.fused_decode = None  # a fused_decode.FusedDecode: pure decode steps in one kernel call
        self.pipeline = None  # a pipeline_stage.StageLink when this module is one pipeline stage

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: Any,
        kv_caches: list[KVCache],
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        pipeline, residual = self.pipeline, None
        if pipeline is None or pipeline.is_first:
            hidden = self.model.embed_tokens(input_ids)
        else:
            hidden, residual = pipeline.receive(input_ids.shape[0], input_ids.device)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)
        fused = (
            None
            if self.fused_decode is None or pipeline is not None
            else self.fused_decode(hidden, cos, sin, attn_metadata, kv_caches)
        )
        if fused is not None:
            hidden = self.model.norm(*fused)[0]
            return hidden if output_rows is None else hidden[output_rows]
        last = len(self.model.layers) - 1 if pipeline is None or pipeline.is_last else None
        for index, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            rows = output_rows if index == last else None
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, attn_metadata, rows)
        if last is None:  # an earlier pipeline stage: the next one goes on from here
            pipeline.send(hidden, residual)
            num_rows = hidden.shape[0] if output_rows is None else output_rows.shape[0]
            return hidden.new_empty((num_rows, 0))
        if residual is None:  # a model with no layers
            hidden = self.model.norm(hidden)
            return hidden if output_rows is None else hidden[output_rows]
        return self.model.norm(hidden, residual)[0]

    def sampled_logits(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: Any,
        kv_caches: list[KVCache],
        rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """``[len(rows), vocab]``: the logits of the flat batch's rows ``rows`` (the sampled ones, an
        int64 tensor on the model's device) after a forward over every token; the last layer's
        projection and MLP run on them alone (``output_rows``). ``rows`` None: every row, in order.
        An earlier pipeline stage: ``[len(rows), 0]``."""
        hidden = self(input_ids, positions, attn_metadata, kv_caches, output_rows=rows)
        if self.pipeline is not None and not self.pipeline.is_last:
            return hidden
        return self.compute_logits(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(hidden, self.model.embed_tokens.weight)
        return self.lm_head(hidden)

    def untie_lm_head(self) -> None:
        """Give tied embeddings an ``lm_head`` module sharing their weight (so weight packing sees it);
        an earlier pipeline stage has no head."""
        if self.pipeline is not None and not self.pipeline.is_last:
            return
        if self.lm_head is None:
            weight = self.model.embed_tokens.weight
            with torch.device("meta"):
                self.lm_head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            self.lm_head.weight = weight
