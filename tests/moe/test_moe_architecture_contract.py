"""Core's MoE architectures pass the architecture kit every architecture plugin passes
(``hetero_core.testing.ArchitectureContract``): logits and greedy tokens against transformers,
chunked prefill, preemption (recompute and swap), the executor contract."""

from __future__ import annotations

from hetero_core.testing import ArchitectureContract
from tests.moe.tiny_moe_models import build_tiny_moe_model


class TestQwen3MoeArchitecture(ArchitectureContract):
    def make_hf_model(self):
        return build_tiny_moe_model("qwen3_moe")


class TestQwen2MoeArchitecture(ArchitectureContract):
    def make_hf_model(self):
        return build_tiny_moe_model("qwen2_moe")


class TestMixtralArchitecture(ArchitectureContract):
    def make_hf_model(self):
        return build_tiny_moe_model("mixtral")
