"""``MoeForCausalLM``: the Llama-family decoder (attention, norms, RoPE, the flat batch; see ``llama``)
with the MLP of each sparse layer replaced by a ``SparseMoeBlock``; the dense layers a config names
(``mlp_only_layers``, ``decoder_sparse_step``) keep the SwiGLU MLP of ``config.intermediate_size``."""

from __future__ import annotations

from hetero_core.model.attention import AttentionBackend
from hetero_core.model.llama import LlamaForCausalLM
from hetero_core.model.moe.block import SparseMoeBlock
from hetero_core.model.moe.config import MoeModelConfig


class MoeForCausalLM(LlamaForCausalLM):
    """As ``LlamaForCausalLM`` (the same forward, ``sampled_logits``, ``compute_logits``); the
    experts' settings are ``config.moe``."""

    captures_in_cuda_graphs = False  # each MoE layer reads its experts' token counts on the host

    def __init__(self, config: MoeModelConfig, backend: AttentionBackend):
        super().__init__(config, backend)
        for index in config.moe.sparse_layers:
            self.model.layers[index].mlp = SparseMoeBlock(config.hidden_size, config.moe)

    def sparse_blocks(self) -> list[SparseMoeBlock]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, SparseMoeBlock)]
