"""``CausalLM``: what the engine's model code calls on a model module, whatever its architecture.

``LlamaForCausalLM`` is the reference implementation; an architecture's ``build(config, backend)``
(``hetero_core.architectures.ModelArchitecture``) returns an ``nn.Module`` with these members. Every tensor
has the step's scheduled tokens as its first dimension (``[num_tokens, ...]``, no padding), and
attention goes through ``backend`` with the metadata the backend built for the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from hetero_core.model.attention import AttentionBackend, KVCache
    from hetero_core.model.config import ModelConfig


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model over the engine's flat batch.

    - ``config``: its parsed ``ModelConfig`` (the KV layout is its architecture's ``kv_layout(config)``);
    - ``backend``: the attention backend it was built with (``runner.ModelRunner`` builds the cache
      and the step's metadata with it);
    - ``lm_head``: the output projection module (None while tied to the embedding);
    - optional ``rotary``: an object whose ``inv_freq`` tensor the runner moves to the model's device.
    """

    config: ModelConfig
    backend: AttentionBackend
    lm_head: Any

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: Any,
        kv_caches: list[KVCache],
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` after the final norm (only ``output_rows``' rows when
        given); every token's K/V is written to ``kv_caches`` (one per layer) at the step's slots."""
        ...

    def sampled_logits(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: Any,
        kv_caches: list[KVCache],
        rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """``[len(rows), vocab]`` logits of the flat rows ``rows`` (int64, on the model's device) after a
        forward over every token; ``rows`` None: every row, in order."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[rows, vocab]`` logits of hidden states (softcapping and scaling included)."""
        ...

    def untie_lm_head(self) -> None:
        """Give tied embeddings an ``lm_head`` module sharing their weight (weight packing packs it)."""
        ...
