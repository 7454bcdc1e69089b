"""The embedded SmolLM2 is a Q4_1 GGUF (Q8_0 embeddings): in fp32 its linears stream block codes,
with the same logits as the fp32 weights, bit for bit, with ``code_activations = "float"``; with the
default int8 activations within their quantization of the fp32 logits; ``block_code_weights = false``
turns the codes off."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu.linear import PackedLinear


def _linear_kinds(executor) -> Counter:
    return Counter(
        (m.kernel_dtype, m.kernel_weight.dtype)
        for m in executor.model.modules()
        if isinstance(m, PackedLinear)
    )


def _logits(executor, token_ids: list[int]) -> torch.Tensor:
    model = executor.model
    hidden = model.model.embed_tokens(torch.tensor(token_ids))
    for layer in model.model.layers:  # every linear, without attention's context (q stands in for its output)
        attention = layer.self_attn
        q = attention.qkv_proj(layer.input_layernorm(hidden))[:, : attention.o_proj.in_features]
        hidden = hidden + attention.o_proj(q)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.compute_logits(model.model.norm(hidden))


@pytest.mark.slow
def test_the_embedded_model_streams_block_codes_with_identical_logits(
    smollm2_dir, make_executor, cpu_kernels
):
    options = {"dtype": "float32", "prepared_weights_cache": False}
    coded = make_executor(smollm2_dir, options=TorchExecutorOptions(**options, code_activations="float"))
    plain = make_executor(smollm2_dir, options=TorchExecutorOptions(**options, block_code_weights=False))
    layers = len(coded.model.model.layers)
    assert _linear_kinds(coded) == {
        ("codes", torch.uint8): 4 * layers,
        ("codes", torch.int8): 1,
    }  # head: Q8_0
    assert _linear_kinds(plain) == {("f32", torch.float32): 4 * layers + 1}
    for rows in ([5], list(range(100, 109)), list(range(200, 240))):  # 1 row, 9 rows, 40 rows: every path
        assert torch.equal(_logits(coded, rows), _logits(plain, rows))


@pytest.mark.slow
def test_int8_code_activations_stay_close_to_the_fp32_logits(smollm2_dir, make_executor, cpu_kernels):
    """``code_activations = "int8"`` (opt-in): the code linears take int8 activations (q8a_coded_linear)
    where VNNI or AVX2 sums them; the logits move by the activations' rounding only."""
    options = {"dtype": "float32", "prepared_weights_cache": False}
    int8 = make_executor(smollm2_dir, options=TorchExecutorOptions(**options, code_activations="int8"))
    plain = make_executor(smollm2_dir, options=TorchExecutorOptions(**options, code_activations="float"))
    linears = [m for m in int8.model.modules() if isinstance(m, PackedLinear)]
    assert all(m.int8_activations == int8.model.lm_head.kernels.int8_code_activations for m in linears)
    if not linears[0].int8_activations:
        pytest.skip("this CPU has neither AVX-512 VNNI nor AVX2: the codes take fp32 activations")
    rows = list(range(200, 240))
    quantized, exact = _logits(int8, rows), _logits(plain, rows)
    assert not torch.equal(quantized, exact)
    error = quantized - exact  # 30 layers of rounded activations: ~2 % of a logit's size on average
    assert error.abs().mean() < 0.04 * exact.abs().mean() and error.abs().max() < 0.1 * exact.abs().max()
    agree = (quantized.argmax(-1) == exact.argmax(-1)).float().mean()
    assert agree >= 0.8, f"the next token agrees in {agree:.0%} of rows"
