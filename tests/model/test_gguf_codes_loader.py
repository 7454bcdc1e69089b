"""A GGUF loads for the CPU kernels from its codes (``gguf_codes_loader``): the same logits, bit for bit,
as the fp32 model of its dequantized weights on the kernels' fp32 linear, from a fraction of the bytes;
fused q/k/v and gate/up of mixed types, llama's q/k permutation, Q6_K and types without codes (one
warning) included; bf16 activations over the same codes; the conversion keeps no fp32 weights."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu.code_panels import (
    CODES_Q4,
    CODES_Q4_SUPER,
    CODES_Q8,
    CODES_Q8_SUB16,
    CODES_Q8_SUB16_SUPER,
    code_format,
)
from hetero_core.model.cpu.linear import PackedLinear
from hetero_core.model.cpu.prepared_weights import load_packed_model, pack_model
from hetero_core.model.cpu.split_linear import SplitLinear
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.embedded import find_embedded_gguf
from hetero_core.model.gguf_cache import ensure_gguf_converted
from hetero_core.model.loader import load_model
from tests.model.gguf_files import mixed_types, requantized, write_mixed_gguf
from tests.model.paged_batches import prompt_logits

PROMPTS = ([1, 504, 3458, 314, 4155, 282], list(range(100, 121)), [9, 8, 7, 6, 5, 4, 3, 2])
FP32 = {"dtype": "float32", "prepared_weights_cache": False, "code_activations": "float"}  # fp32 bits


def linear_kinds(model) -> Counter:
    return Counter(
        (m.kernel_dtype, None if m.kernel_weight is None else m.kernel_weight.dtype)
        for m in model.modules()
        if isinstance(m, PackedLinear)
    )


def linears_only_logits(model, token_ids: list[int]) -> torch.Tensor:
    """Every linear of the model on ``token_ids`` (q standing in for attention's output)."""
    hidden = model.model.embed_tokens(torch.tensor(token_ids))
    for layer in model.model.layers:
        attention = layer.self_attn
        q = attention.qkv_proj(layer.input_layernorm(hidden))[:, : attention.o_proj.in_features]
        hidden = hidden + attention.o_proj(q)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.compute_logits(model.model.norm(hidden))


def greedy(executor, prompt: list[int], tokens: int = 8) -> list[int]:
    out = list(prompt)
    for _ in range(tokens):
        out.append(int(prompt_logits(executor, out)[-1].argmax()))
    return out[len(prompt) :]


@pytest.fixture(scope="session")
def q8_0_dir(tmp_path_factory):
    """The embedded SmolLM2 re-quantized to Q8_0 (every quantized tensor), converted into a cache."""
    root = tmp_path_factory.mktemp("q8_0")
    path = requantized(find_embedded_gguf(), root / "SmolLM2-135M-Instruct.Q8_0.gguf", "Q8_0")
    return ensure_gguf_converted(path, root / "cache")


@pytest.mark.slow
def test_a_q8_0_gguf_runs_its_codes_with_the_fp32_models_logits_and_tokens(
    q8_0_dir, make_executor, cpu_kernels
):
    assert not (q8_0_dir / "model.safetensors").exists()  # the conversion keeps config and tokenizer only
    coded = make_executor(q8_0_dir, options=TorchExecutorOptions(**FP32))
    assert not (q8_0_dir / "model.safetensors").exists()  # nor does the load write fp32 weights
    layers = len(coded.model.model.layers)
    assert linear_kinds(coded.model) == {("codes", torch.int8): 4 * layers + 1}
    assert coded.model.fused_decode is not None  # decode steps still run all layers in one call
    plain = make_executor(q8_0_dir, options=TorchExecutorOptions(**FP32, block_code_weights=False))
    assert (q8_0_dir / "model.safetensors").is_file()  # converted for the load that reads fp32 weights
    assert linear_kinds(plain.model) == {("f32", torch.float32): 4 * layers + 1}
    assert coded.linear_weight_bytes * 3 < plain.linear_weight_bytes
    for prompt in PROMPTS:
        assert torch.equal(prompt_logits(coded, prompt), prompt_logits(plain, prompt))
        assert greedy(coded, prompt) == greedy(plain, prompt)


@pytest.mark.slow
def test_bf16_activations_run_over_the_same_codes(q8_0_dir, make_executor, cpu_kernels):
    """In bf16 the linears keep the codes (not weights rounded to bf16): bf16 only rounds activations."""
    coded = make_executor(
        q8_0_dir,
        options=TorchExecutorOptions(
            dtype="bfloat16", prepared_weights_cache=False, code_activations="float"
        ),
    )
    assert linear_kinds(coded.model) == {("codes", torch.int8): 4 * len(coded.model.model.layers) + 1}
    fp32 = make_executor(q8_0_dir, options=TorchExecutorOptions(**FP32))
    logits, reference = prompt_logits(coded, PROMPTS[1]), prompt_logits(fp32, PROMPTS[1])
    assert logits.dtype == torch.float32 and logits.shape == reference.shape
    assert (logits - reference).abs().max() < 0.5  # bf16 activations: close, not equal
    assert logits[-1].argmax() == reference[-1].argmax()


@pytest.fixture
def mixed_dir(tmp_path):
    path = write_mixed_gguf(tmp_path / "mixed.gguf", mixed_types())
    return ensure_gguf_converted(path, tmp_path / "cache")


@pytest.mark.parametrize("chunk_rows", [4096, 32])  # whole tensors, and tensors decoded 32 rows at a time
def test_mixed_types_keep_their_codes_with_the_dequantized_models_logits(
    mixed_dir, cpu_kernels, caplog, monkeypatch, chunk_rows
):
    import dataclasses

    from hetero_core.model.cpu import gguf_code_linears

    monkeypatch.setattr(gguf_code_linears, "CHUNK_ROWS", chunk_rows)
    cpu_kernels = dataclasses.replace(cpu_kernels, code_activations="float")  # fp32 bits, compared exactly
    backend = TorchPagedAttention(cpu_kernels=cpu_kernels)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        coded = load_packed_model(
            mixed_dir, mixed_dir.parent, backend=backend, dtype=torch.float32, kernels=cpu_kernels
        )
    [warning] = [r.getMessage() for r in caplog.records if "gguf_type_expanded" in r.getMessage()]
    assert "blk.1.ffn_down.weight as Q2_K" in warning and "Q4_K_M, Q5_K_M or Q8_0" in warning
    layers = coded.model.layers
    assert layers[0].self_attn.qkv_proj.kernel_weight.dtype == torch.int8  # Q4_K q widened beside Q5_K k
    assert layers[0].mlp.gate_up_proj.kernel_weight.dtype == torch.uint8 and layers[0].mlp.gate_up_proj.swiglu
    assert code_format(layers[0].self_attn.o_proj.kernel_weight) == CODES_Q8_SUB16_SUPER  # Q6_K
    assert layers[0].mlp.down_proj.kernel_weight.dtype == torch.int8  # Q5_0
    qkv = layers[1].self_attn.qkv_proj  # Q4_K q and Q4_0 k as one 4-bit weight, the Q6_K v apart
    assert isinstance(qkv, SplitLinear)
    assert [code_format(p.kernel_weight) for p in qkv.parts] == [CODES_Q4, CODES_Q8_SUB16_SUPER]
    assert [p.out_features for p in qkv.parts] == [256 + 128, 128]  # q and k rows, v rows
    gate_up = layers[1].mlp.gate_up_proj  # a Q5_K gate and a Q6_K up: split, the MLP applies SwiGLU
    assert isinstance(gate_up, SplitLinear) and not gate_up.swiglu
    assert [code_format(p.kernel_weight) for p in gate_up.parts] == [CODES_Q8, CODES_Q8_SUB16_SUPER]
    assert layers[1].mlp.down_proj.kernel_dtype == "f32"  # Q2_K: dequantized
    assert coded.lm_head.kernel_dtype == "codes"  # the tied head keeps the embedding's Q4_K codes

    plain = load_model(mixed_dir)  # gguf's dequantize, un-permuted: the fp32 model
    pack_model(plain, dataclasses.replace(cpu_kernels, block_codes=False))
    for layer in coded.model.layers:  # the split gate/up's SiLU-and-multiply as the executor runs it
        layer.mlp.kernels = cpu_kernels  # (use_cpu_kernels): the fused SwiGLU kernel's bits
    for prompt in ([1, 2, 3], list(range(40, 80))):
        expected = linears_only_logits(plain, prompt)
        assert torch.isfinite(expected).all()
        assert torch.equal(linears_only_logits(coded, prompt), expected)


def test_the_direct_path_needs_the_kernels_block_codes(mixed_dir, cpu_kernels):
    """With ``block_code_weights = false`` (the kernels' ``block_codes`` off) the fp32 weights load."""
    import dataclasses

    kernels = dataclasses.replace(cpu_kernels, block_codes=False)
    backend = TorchPagedAttention(cpu_kernels=kernels)
    model = load_packed_model(
        mixed_dir, mixed_dir.parent, backend=backend, dtype=torch.float32, kernels=kernels
    )
    assert {kind for kind, _ in linear_kinds(model)} == {"f32"}
    assert (mixed_dir / "model.safetensors").is_file()


def test_the_prepared_file_keeps_the_codes(mixed_dir, cpu_kernels, monkeypatch):
    from hetero_core.model.cpu import prepared_weights

    monkeypatch.setattr(prepared_weights, "MIN_CHECKPOINT_BYTES", 0)
    backend = TorchPagedAttention(cpu_kernels=cpu_kernels)
    first = load_packed_model(
        mixed_dir, mixed_dir.parent, backend=backend, dtype=torch.float32, kernels=cpu_kernels
    )
    path = prepared_weights.prepared_path(mixed_dir, mixed_dir.parent, torch.float32, cpu_kernels)
    assert path.is_file()
    again = load_packed_model(
        mixed_dir, mixed_dir.parent, backend=backend, dtype=torch.float32, kernels=cpu_kernels
    )
    assert linear_kinds(again) == linear_kinds(first)
    assert again.model.layers[0].self_attn.qkv_proj.kernel_weight.dtype == torch.int8
    split = again.model.layers[1].self_attn.qkv_proj
    assert isinstance(split, SplitLinear)
    assert [code_format(p.kernel_weight) for p in split.parts] == [CODES_Q4, CODES_Q8_SUB16_SUPER]
    assert not (mixed_dir / "model.safetensors").exists()
    prompt = list(range(3, 30))
    assert torch.equal(linears_only_logits(again, prompt), linears_only_logits(first, prompt))


def test_the_auto_probe_loads_only_the_first_layers_codes(mixed_dir, cpu_kernels):
    """``dtype = "auto"``'s probe of a GGUF (``num_layers``): the first layers' codes and the head, the
    same packed weights the whole model gets, and no fp32 weights written for the folder."""
    from hetero_core.model.cpu.gguf_codes_loader import load_codes_model
    from hetero_core.model.gguf_cache import gguf_source

    backend = TorchPagedAttention(cpu_kernels=cpu_kernels)
    gguf = gguf_source(mixed_dir)
    whole = load_codes_model(mixed_dir, gguf, backend=backend, dtype=torch.float32, kernels=cpu_kernels)
    probe = load_codes_model(
        mixed_dir, gguf, backend=backend, dtype=torch.float32, kernels=cpu_kernels, num_layers=1
    )
    assert len(probe.model.layers) == 1 and probe.config.num_hidden_layers == 1
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        ours = probe.model.layers[0].get_submodule(name).kernel_weight
        assert torch.equal(ours, whole.model.layers[0].get_submodule(name).kernel_weight), name
    assert torch.equal(probe.lm_head.kernel_weight, whole.lm_head.kernel_weight)
    assert not (mixed_dir / "model.safetensors").exists()


def test_a_converted_folder_without_weights_is_sized_and_probed_from_its_gguf(mixed_dir):
    """``block_code_weights = false`` on a GGUF: the prepared file's size bound and ``auto``'s probe read
    the folder's GGUF (converting its fp32 weights on first use), never a missing safetensors file."""
    from hetero_core.model.cpu.prepared_weights import prepared_bytes
    from hetero_core.model.cpu.probe_model import first_layers

    assert not (mixed_dir / "model.safetensors").exists()
    bound = prepared_bytes(mixed_dir, torch.bfloat16)  # from the GGUF's tensor infos
    probe = first_layers(mixed_dir, 1, backend=None, dtype=torch.float32)  # converts the weights first
    whole = load_model(mixed_dir)
    assert bound >= sum(t.numel() for t in whole.state_dict().values()) * 2
    assert len(probe.model.layers) == 1 < whole.config.num_hidden_layers


@pytest.mark.parametrize("name", ["Q6_K", "Q4_K_M"])
def test_llama_cpps_q6_k_runs_as_codes_with_the_dequantized_fp32_models_tokens(
    name, tmp_path, make_executor, cpu_kernels
):
    """llama.cpp's own Q6_K blocks (the tiny fixtures: pure Q6_K, and Q4_K_M's mix with q/k in Q4_K
    beside a Q6_K v) keep every linear as codes, and give the fp32 model's logits and greedy tokens
    (float activations: ``coded_linear`` expands the codes exactly)."""
    from tests.model.test_gguf_fixtures import DATA

    folder = ensure_gguf_converted(DATA / f"tiny-{name}.gguf", tmp_path / "cache")
    coded = make_executor(folder, options=TorchExecutorOptions(**FP32))
    assert {kind for kind, _ in linear_kinds(coded.model)} == {"codes"}  # every linear
    assert code_format(coded.model.lm_head.kernel_weight) == CODES_Q8_SUB16_SUPER  # the output is Q6_K
    split = [m for m in coded.model.modules() if isinstance(m, SplitLinear)]
    assert bool(split) == (name == "Q4_K_M")  # the mix's Q6_K v beside Q4_K q and k
    plain = make_executor(folder, options=TorchExecutorOptions(**FP32, block_code_weights=False))
    assert {kind for kind, _ in linear_kinds(plain.model)} == {"f32"}
    for prompt in ([1, 50, 3, 200, 7], list(range(10, 40))):
        assert torch.equal(prompt_logits(coded, prompt), prompt_logits(plain, prompt))
        assert greedy(coded, prompt) == greedy(plain, prompt)


@pytest.mark.parametrize("activations", ["float", "int8"])
@pytest.mark.parametrize(
    "name, compact_format, per_block_format, bytes_per_weight",
    [("Q6_K", CODES_Q8_SUB16_SUPER, CODES_Q8_SUB16, 1.078125), ("Q4_K", CODES_Q4_SUPER, CODES_Q4, 0.59375)],
)
def test_k_quant_scales_stay_per_super_block_with_the_same_logits(
    activations,
    name,
    compact_format,
    per_block_format,
    bytes_per_weight,
    tmp_path,
    make_executor,
    monkeypatch,
):
    """The k-quants' scales stay per super-block as the file stores them (``super_block_scales``: 1.08
    instead of 1.25 bytes a weight for Q6_K, 0.59 instead of 0.75 for Q4_K), under either activations,
    and the model's logits and tokens are the per-block layout's bits."""
    from hetero_core.model.cpu import gguf_code_linears
    from tests.model.test_gguf_fixtures import DATA

    folder = ensure_gguf_converted(DATA / f"tiny-{name}.gguf", tmp_path / "cache")
    options = TorchExecutorOptions(
        dtype="float32", prepared_weights_cache=False, code_activations=activations
    )
    compact = make_executor(folder, options=options)
    o_proj = compact.model.model.layers[0].self_attn.o_proj.kernel_weight
    assert code_format(o_proj) == compact_format
    assert (
        o_proj.numel() == o_proj.shape[0] * 16 * o_proj.shape[1] * 256 * bytes_per_weight
    )  # [N / 16, K / 256, .]
    monkeypatch.setattr(gguf_code_linears, "super_block_scales", lambda kernels: False)
    per_block = make_executor(folder, options=options)
    o_proj_per_block = per_block.model.model.layers[0].self_attn.o_proj.kernel_weight
    assert code_format(o_proj_per_block) == per_block_format
    assert o_proj_per_block.numel() > o_proj.numel()
    for prompt in ([1, 50, 3, 200, 7], list(range(10, 40))):
        assert torch.equal(prompt_logits(compact, prompt), prompt_logits(per_block, prompt))
        assert greedy(compact, prompt) == greedy(per_block, prompt)
