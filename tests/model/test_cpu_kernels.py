"""The compiled CPU kernels (K/V write, decode and prefill attention): same answers as the torch
path, their build cache, and what happens where no C compiler works."""

from __future__ import annotations

import pytest
import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.errors import ConfigError
from hetero_core.model import cpu_kernels as cpu_kernels_module
from hetero_core.model.attention import KVCache
from hetero_core.model.cpu_kernels import KernelUnavailable, load_cpu_kernels
from hetero_core.model.torch_attention import TorchPagedAttention
from paged_batches import BlockPool, PagedSequence, step

CPU = torch.device("cpu")


@pytest.fixture
def kernel(cpu_kernels):
    return cpu_kernels


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """A machine without a working C compiler and with an empty kernel cache."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    cpu_kernels_module._load.cache_clear()
    yield
    cpu_kernels_module._load.cache_clear()


def _decode_step(lengths, num_kv_heads, group_size, head_dim, block_size, dtype, seed=0):
    """Sequences of ``lengths`` tokens decoding together over shuffled blocks filled with random K/V."""
    torch.manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lengths) + 4
    pool = BlockPool(num_blocks, shuffle=True, seed=seed)
    seqs = [PagedSequence(i, list(range(n)), n - 1) for i, n in enumerate(lengths)]
    step([(s, n - 1) for s, n in zip(seqs, lengths, strict=True) if n > 1], pool, block_size)
    batch = step([(s, 1) for s in seqs], pool, block_size)
    cache = KVCache(*(torch.randn(num_kv_heads, num_blocks, block_size, head_dim).to(dtype)
                      for _ in range(2)))
    # query rows strided as in the model (q is a slice of the fused q/k/v projection's output)
    fused = torch.randn(len(lengths), num_kv_heads * (group_size + 2), head_dim).to(dtype)
    return batch, cache, fused[:, : num_kv_heads * group_size]


def _both_paths(kernel, batch, cache, query):
    with_kernel, plain = TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()
    metadata = plain.build_metadata(batch, CPU)
    outs = [backend._attend_decode(query, cache, metadata.decode, 0.125, backend._kernels_for(query, cache))
            for backend in (with_kernel, plain)]
    return outs[0], outs[1].to(outs[0].dtype)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("num_kv_heads, group_size, head_dim, block_size", [
    (3, 3, 64, 16),  # SmolLM2-135M
    (2, 4, 128, 16),
    (4, 1, 32, 8),  # no grouping
    (1, 7, 64, 1),  # MQA, one token per block
])
def test_kernel_matches_the_torch_path(kernel, dtype, tolerance, num_kv_heads, group_size, head_dim, block_size):
    lengths = [1, 2, block_size, block_size + 1, 3 * block_size, 97, 300]
    batch, cache, query = _decode_step(lengths, num_kv_heads, group_size, head_dim, block_size, dtype)
    out, expected = _both_paths(kernel, batch, cache, query)
    assert out.shape == query.shape and out.dtype == dtype and out.is_contiguous()
    assert (out.float() - expected.float()).abs().max().item() < tolerance


def test_a_non_finite_query_spoils_only_its_own_head(kernel):
    batch, cache, query = _decode_step([5, 40, 17], 3, 3, 64, 16, torch.float32)
    query = query.clone()
    query[1, 0, 0] = float("nan")
    out, expected = _both_paths(kernel, batch, cache, query)
    assert out[1, 0].isnan().all() and expected[1, 0].isnan().all()
    out[1, 0], expected[1, 0] = 0.0, 0.0  # every other head, of this sequence too, is untouched
    assert (out - expected).abs().max().item() < 1e-5


def test_mixed_steps_use_the_kernel_for_their_decodes(kernel):
    """A step with a prefill among decodes: the decodes and the prefill (both attended by the
    kernels) match the pure-torch backend."""
    pool = BlockPool(64)
    decoding = [PagedSequence(i, list(range(n)), n - 1) for i, n in enumerate([9, 33, 70])]
    step([(s, len(s.token_ids) - 1) for s in decoding], pool, 16)
    fresh = PagedSequence(9, list(range(25)), 25)
    batch = step([(decoding[0], 1), (fresh, 25), (decoding[1], 1), (decoding[2], 1)], pool, 16)
    torch.manual_seed(1)
    shapes = [(batch.num_tokens, 9, 64), (batch.num_tokens, 3, 64), (batch.num_tokens, 3, 64)]
    query, key, value = (torch.randn(shape) for shape in shapes)
    outs = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = backend.allocate_kv_cache(1, 64, 16, 3, 64, torch.float32, CPU)[0]
        torch.manual_seed(2)
        cache.key.copy_(torch.randn(cache.key.shape))
        cache.value.copy_(torch.randn(cache.value.shape))
        outs.append(backend.forward(query, key, value, cache, backend.build_metadata(batch, CPU), scale=0.125))
    assert (outs[0] - outs[1]).abs().max().item() < 1e-5


def _forward_both(kernel, batch, num_blocks, num_kv_heads, group_size, head_dim, block_size, dtype, seed=0):
    """``batch`` through the kernels' backend and the pure-torch one, over the same random cache
    contents (the cached prefixes) and step K/V: (outputs, caches) of each."""
    torch.manual_seed(seed)
    num_heads = num_kv_heads * group_size
    # q/k/v as the model hands them: slices of one fused projection output (strided rows)
    fused = torch.randn(batch.num_tokens, num_heads + 2 * num_kv_heads, head_dim).to(dtype)
    query, key, value = fused.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    contents = [torch.randn(num_kv_heads, num_blocks, block_size, head_dim).to(dtype) for _ in range(2)]
    results = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = KVCache(*(tensor.clone() for tensor in contents))
        out = backend.forward(query, key, value, cache, backend.build_metadata(batch, CPU), scale=head_dim**-0.5)
        results.append((out, cache))
    return results


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("num_kv_heads, group_size, head_dim, block_size", [
    (3, 3, 64, 16),  # SmolLM2-135M
    (2, 4, 128, 16),
    (4, 1, 40, 8),  # no grouping; a head size that is not a multiple of 16
    (1, 7, 64, 1),  # MQA, one token per block
])
def test_prefill_kernel_matches_the_torch_path(kernel, dtype, tolerance, num_kv_heads, group_size, head_dim,
                                               block_size):
    """Fresh prompts of many lengths (one token short of, at and past the kernel's 16-token tiles and
    64-key chunks) and prompts continuing a cached prefix, in one step over shuffled blocks."""
    num_blocks = 720  # block_size 1 needs one per token
    pool = BlockPool(num_blocks, shuffle=True, seed=3)
    fresh = [PagedSequence(i, list(range(n)), n) for i, n in enumerate([2, 15, 16, 17, 63, 64, 65, 130])]
    continued = [PagedSequence(10 + i, list(range(n)), n) for i, n in enumerate([40, 100, 200])]
    step([(seq, cached) for seq, cached in zip(continued, [1, 37, 128], strict=True)], pool, block_size)
    batch = step([(seq, seq.num_remaining) for seq in [*fresh, *continued]], pool, block_size)
    (out, cache), (expected, expected_cache) = _forward_both(
        kernel, batch, num_blocks, num_kv_heads, group_size, head_dim, block_size, dtype)
    assert out.shape == expected.shape and out.dtype == dtype
    assert (out.float() - expected.float()).abs().max().item() < tolerance
    assert torch.equal(cache.key, expected_cache.key) and torch.equal(cache.value, expected_cache.value)


def test_a_non_finite_prefill_query_spoils_only_its_own_row_and_head(kernel):
    pool = BlockPool(64)
    seqs = [PagedSequence(i, list(range(n)), n) for i, n in enumerate([20, 30])]
    batch = step([(seq, seq.num_remaining) for seq in seqs], pool, 16)
    torch.manual_seed(0)
    query, key, value = torch.randn(50, 9, 64), torch.randn(50, 3, 64), torch.randn(50, 3, 64)
    query[25, 4, 0] = float("nan")  # the second sequence's 6th token, head 4
    outs = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = backend.allocate_kv_cache(1, 64, 16, 3, 64, torch.float32, CPU)[0]
        outs.append(backend.forward(query, key, value, cache, backend.build_metadata(batch, CPU), scale=0.125))
    out, expected = outs
    assert out[25, 4].isnan().all()
    out[25, 4], expected[25, 4] = 0.0, 0.0
    assert not out.isnan().any() and (out - expected).abs().max().item() < 1e-5


def test_the_kv_write_refuses_a_slot_outside_the_cache_and_writes_nothing(kernel):
    key_cache, value_cache = torch.zeros(2, 4, 8, 16), torch.zeros(2, 4, 8, 16)
    key, value = torch.ones(3, 2, 16), torch.ones(3, 2, 16)
    with pytest.raises(ValueError, match="outside the cache"):
        kernel.write_kv(key, value, key_cache, value_cache, torch.tensor([0, 5, 32]))
    assert not key_cache.any() and not value_cache.any()
    kernel.write_kv(key, 2 * value, key_cache, value_cache, torch.tensor([0, 9, 31]))
    written = key_cache.view(2, 32, 16)
    assert written[:, [0, 9, 31]].eq(1).all() and written.sum() == 3 * 2 * 16
    assert value_cache.view(2, 32, 16)[:, [0, 9, 31]].eq(2).all()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("same_strides", [True, False])
def test_a_decode_step_writes_its_kv_and_attends_in_one_call(kernel, dtype, tolerance, same_strides):
    """A pure decode step goes through one kernel call that writes the new K/V rows and attends;
    K and V may come with different token strides (K rotated into its own tensor, V a slice of
    the projection), as the model hands them when RoPE runs in torch."""
    pool = BlockPool(64, shuffle=True, seed=1)
    seqs = [PagedSequence(i, list(range(n)), n - 1) for i, n in enumerate([5, 38, 21, 70])]
    step([(seq, len(seq.token_ids) - 1) for seq in seqs], pool, 4)
    batch = step([(seq, 1) for seq in seqs], pool, 4)
    torch.manual_seed(0)
    fused = torch.randn(4, 3 * 3 + 2 * 3, 64).to(dtype)
    query, key, value = fused.split([9, 3, 3], dim=1)
    if not same_strides:
        key = key.clone()
    contents = [torch.randn(3, 64, 4, 64).to(dtype) for _ in range(2)]
    results = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = KVCache(*(tensor.clone() for tensor in contents))
        results.append((backend.forward(query, key, value, cache, backend.build_metadata(batch, CPU), 0.125), cache))
    (out, cache), (expected, expected_cache) = results
    assert (out.float() - expected.float()).abs().max().item() < tolerance
    assert torch.equal(cache.key, expected_cache.key) and torch.equal(cache.value, expected_cache.value)


def test_sizes_beyond_the_kernels_limits_take_the_torch_path(kernel):
    query = torch.randn(2, 4, cpu_kernels_module.MAX_HEAD_DIM + 8)
    assert not kernel.supports(query, num_kv_heads=2)
    assert not kernel.supports(torch.randn(2, 4, 64).half(), num_kv_heads=2)
    assert kernel.supports(torch.randn(2, 4, 64), num_kv_heads=2)


def test_the_library_is_built_once_into_the_cache(kernel, monkeypatch, tmp_path):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    cpu_kernels_module._load.cache_clear()
    try:
        built = load_cpu_kernels(required=True).path
        assert built.parent == tmp_path / "kernels" and built.is_file()
        stamp = built.stat().st_mtime_ns
        cpu_kernels_module._load.cache_clear()

        def no_process(*args, **kwargs):
            raise AssertionError(f"a cached library started a process: {args}")

        with monkeypatch.context() as patch:  # a cached library costs no compiler run (not even --version)
            patch.setattr(cpu_kernels_module.subprocess, "run", no_process)
            assert load_cpu_kernels(required=True).path == built and built.stat().st_mtime_ns == stamp
        assert [p.name for p in built.parent.iterdir()] == [built.name]  # no temporaries left
    finally:
        cpu_kernels_module._load.cache_clear()


def test_without_a_compiler_auto_falls_back_and_kernel_is_refused(no_compiler, tiny_model_dirs, make_executor):
    assert load_cpu_kernels() is None
    with pytest.raises(KernelUnavailable, match="C compiler"):
        load_cpu_kernels(required=True)
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=TorchExecutorOptions(cpu_kernels="auto"))
    assert executor.backend.cpu_kernels is None
    with pytest.raises(ConfigError, match='cpu_kernels = "compiled".*C compiler'):
        make_executor(model_dir, options=TorchExecutorOptions(cpu_kernels="compiled"))


def test_the_option_chooses_the_path(kernel, tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["llama"]
    assert make_executor(model_dir, options=TorchExecutorOptions(cpu_kernels="torch")).backend.cpu_kernels is None
    chosen = make_executor(model_dir, options=TorchExecutorOptions(cpu_kernels="compiled")).backend.cpu_kernels
    assert chosen is not None and chosen.path == kernel.path
    assert make_executor(model_dir).backend.cpu_kernels.path == kernel.path  # auto, where it builds


@pytest.mark.parametrize("cpu_kernels", ["torch", "compiled"])
def test_greedy_tokens_do_not_depend_on_the_kernels(cpu_kernels, tiny_model_dirs, kernel):
    """A tiny Llama through the whole engine: the same greedy tokens with or without the kernels."""
    from hetero_core import LLM, SamplingParams

    model_dir, _ = tiny_model_dirs["llama"]
    prompts = [[5, 9, 2, 7], list(range(3, 40)), [11] * 20]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    runs = []
    for path in ("torch", cpu_kernels):
        llm = LLM(model=str(model_dir), executor={"name": "torch", "torch": {"cpu_kernels": path}},
                  tokenizer="byte", block_size=4, max_num_blocks=64)
        runs.append([out.output_token_ids for out in llm.generate(prompts, params)])
        llm.shutdown()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, 3, 200])  # 200 x 576: enough rows to split over threads
def test_the_element_wise_kernels_match_the_torch_layers(kernel, dtype, tolerance, rows):
    """RMSNorm (alone and fused with the residual add), SiLU-and-multiply and RoPE in place against
    the layers' torch code on the same inputs."""
    from hetero_core.model.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary

    torch.manual_seed(rows)
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data.uniform_(0.5, 1.5)
    x, residual = (torch.randn(rows, 576).to(dtype) for _ in range(2))
    expected = norm(x)
    expected_sum_norm, expected_sum = norm(x, residual.clone())
    norm.kernels = kernel
    close = lambda got, want: (got.float() - want.float()).abs().max().item() < tolerance * max(1, want.abs().max())  # noqa: E731
    assert close(norm(x), expected)
    fused_residual = residual.clone()
    got_norm, got_sum = norm(x, fused_residual)
    assert got_sum is fused_residual and close(got_sum, expected_sum) and close(got_norm, expected_sum_norm)

    mlp = SwiGLU(576, 1536, bias=False).to(dtype)
    gate_up = 4 * torch.randn(rows, 3072).to(dtype)  # large |x| too: silu's exp must not overflow
    gate, up = gate_up.chunk(2, dim=-1)
    assert close(kernel.silu_mul(gate_up), torch.nn.functional.silu(gate) * up)
    mlp.kernels = kernel
    assert mlp(x).shape == (rows, 576)

    rotary = RotaryEmbedding(64, 10000.0, None)
    cos, sin = rotary.cos_sin(torch.arange(rows) * 7, dtype)
    qkv = torch.randn(rows, 15, 64).to(dtype)  # 9 query + 3 key heads rotated, 3 value heads not
    expected_qk = apply_rotary(qkv[:, :12], cos, sin)
    values = qkv[:, 12:].clone()
    kernel.rotary_(qkv[:, :12], cos, sin)
    assert close(qkv[:, :12], expected_qk) and torch.equal(qkv[:, 12:], values)


def test_widths_the_element_wise_kernels_cannot_take_stay_on_torch(kernel):
    from hetero_core.model.layers import RMSNorm

    norm = RMSNorm(40, 1e-6)
    norm.kernels = kernel
    x = torch.randn(2, 40)
    assert not kernel.handles(x, 40) and kernel.handles(torch.randn(2, 48), 48)
    assert not kernel.handles(x.half(), 48)
    norm.kernels = None
    expected = norm(x)
    norm.kernels = kernel
    assert torch.equal(norm(x), expected)  # the torch path, untouched


@pytest.fixture
def bf16_linear_kernels(kernel):
    if not kernel.has_bf16_linear:
        pytest.skip("the kernels were built without AVX-512 BF16 (this CPU, -march=native), so no bf16 linear")
    return kernel


@pytest.mark.parametrize("rows", [1, 5, 12, 13, 17, 33, 64])
@pytest.mark.parametrize("out_features, bias", [(48, True), (96, False)])  # 48: an odd number of 16-column panels
def test_the_bf16_linear_matches_an_fp32_reference(bf16_linear_kernels, rows, out_features, bias):
    torch.manual_seed(rows)
    weight = torch.randn(out_features, 200).bfloat16()
    bias_f32 = torch.randn(out_features) if bias else None
    x = torch.randn(rows, 260).bfloat16()[:, 30:230]  # strided rows
    packed = bf16_linear_kernels.pack_bf16_linear(weight)
    out = bf16_linear_kernels.bf16_linear(x, packed, bias_f32)
    expected = x.float() @ weight.float().T + (0 if bias_f32 is None else bias_f32)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, out_features)
    assert ((out.float() - expected).abs() <= 0.01 * expected.abs() + 0.05).all()  # bf16 rounding of the output
    exact = bf16_linear_kernels.bf16_linear(x, packed, bias_f32, torch.float32)  # fp32 sums, as for logits
    assert exact.dtype == torch.float32 and (exact - expected).abs().max().item() < 1e-3


@pytest.mark.parametrize("in_features, all_rows", [(96, True), (4098, False)])
def test_packed_linears_take_the_bf16_kernel_where_it_applies(bf16_linear_kernels, in_features, all_rows):
    """Up to ALL_ROWS_MAX_IN_FEATURES inputs every call takes the kernels' bf16 linear and no oneDNN
    copy is kept; wider layers take it for up to FEW_ROWS rows and oneDNN beyond."""
    from hetero_core.model.cpu_linear import ALL_ROWS_MAX_IN_FEATURES, FEW_ROWS, PackedLinear

    assert (in_features <= ALL_ROWS_MAX_IN_FEATURES) == all_rows
    torch.manual_seed(0)
    weight, bias = torch.randn(64, in_features).bfloat16(), torch.randn(64).bfloat16()
    linear = PackedLinear(weight, bias, bf16_linear_kernels)
    assert linear.kernel_dtype == "bf16" and (linear.packed_weight is None) == all_rows
    assert PackedLinear(weight.float(), bias.float(), bf16_linear_kernels).kernel_dtype == "f32"
    assert PackedLinear(weight, bias, None).kernel_weight is None  # no kernels: oneDNN
    assert PackedLinear(torch.randn(40, 96).bfloat16(), None, bf16_linear_kernels).kernel_weight is None  # 40 % 16
    calls = []
    original = bf16_linear_kernels.bf16_linear
    for rows in (1, FEW_ROWS, FEW_ROWS + 1, 300):
        x = torch.randn(rows, in_features).bfloat16()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(bf16_linear_kernels), "bf16_linear",
                          lambda self, *args, **kw: calls.append(rows) or original(*args, **kw))
            out = linear(x)
        expected = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
        assert out.shape == (rows, 64)
        assert ((out.float() - expected).abs() <= 0.01 * expected.abs() + 0.05 * in_features**0.5 / 10).all()
    assert calls == ([1, FEW_ROWS, FEW_ROWS + 1, 300] if all_rows else [1, FEW_ROWS])


def _check_f32_linear(kernels, rows, out_features, bias, in_features=200):
    torch.manual_seed(rows)
    weight = torch.randn(out_features, in_features)
    bias = torch.randn(out_features) if bias else None
    x = torch.randn(rows, in_features + 60)[:, 30:30 + in_features]  # strided rows
    out = kernels.f32_linear(x, kernels.pack_f32_linear(weight), bias)
    expected = (x.double() @ weight.double().T + (0 if bias is None else bias.double())).float()
    assert out.dtype == torch.float32 and out.shape == (rows, out_features)
    assert (out - expected).abs().max().item() < 1e-4 * in_features**0.5


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 12, 13, 17, 33, 64, 100])
@pytest.mark.parametrize("out_features, bias", [(48, True), (96, False), (16, True)])  # 48, 16: partial panel groups
def test_the_f32_linear_matches_a_float64_reference(kernel, rows, out_features, bias):
    _check_f32_linear(kernel, rows, out_features, bias)


@pytest.mark.parametrize("in_features, all_rows", [(96, True), (4098, False)])
def test_fp32_packed_linears_take_the_f32_kernel_where_it_applies(kernel, in_features, all_rows):
    from hetero_core.model.cpu_linear import FEW_ROWS, PackedLinear

    torch.manual_seed(0)
    weight, bias = torch.randn(64, in_features), torch.randn(64)
    linear = PackedLinear(weight, bias, kernel)
    assert linear.kernel_dtype == "f32" and (linear.packed_weight is None) == all_rows
    assert PackedLinear(torch.randn(40, 96), None, kernel).kernel_weight is None  # 40 % 16: oneDNN
    calls = []
    original = kernel.f32_linear
    for rows in (1, FEW_ROWS, FEW_ROWS + 1, 300):
        x = torch.randn(rows, in_features)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(kernel), "f32_linear", lambda self, *args, **kw: calls.append(rows) or original(*args, **kw))
            out = linear(x)
        expected = torch.nn.functional.linear(x.double(), weight.double(), bias.double()).float()
        assert out.shape == (rows, 64) and (out - expected).abs().max().item() < 1e-4 * in_features**0.5
    assert calls == ([1, FEW_ROWS, FEW_ROWS + 1, 300] if all_rows else [1, FEW_ROWS])


def q4_1_weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """What a Q4_1 checkpoint dequantizes to: d * q + m per block of 32 inputs (f16 d and m, q in
    0..15, each block using codes 0 and 15 as the quantizer does)."""
    generator = torch.Generator().manual_seed(seed)
    blocks = in_features // 32
    d = (torch.rand(out_features, blocks, generator=generator) * 0.02 + 1e-3).half().float()
    m = (torch.rand(out_features, blocks, generator=generator) * -0.15).half().float()
    q = torch.randint(0, 16, (out_features, blocks, 32), generator=generator).float()
    q[..., 3], q[..., 17] = 0, 15
    return (d[..., None] * q + m[..., None]).reshape(out_features, in_features)


def q8_0_weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """What a Q8_0 checkpoint dequantizes to: d * q per block of 32 inputs (f16 d, q in -127..127,
    each block reaching +-127 as the quantizer's scale max |w| / 127 makes it)."""
    generator = torch.Generator().manual_seed(seed)
    blocks = in_features // 32
    d = (torch.rand(out_features, blocks, generator=generator) * 0.002 + 1e-4).half().float()
    q = torch.randint(-127, 128, (out_features, blocks, 32), generator=generator).float()
    q[..., 9] = torch.where(torch.rand(out_features, blocks, generator=generator) < 0.5, -127.0, 127.0)
    return (d[..., None] * q).reshape(out_features, in_features)


CODED_WEIGHTS = {"q4_1": (q4_1_weight, torch.uint8), "q8_0": (q8_0_weight, torch.int8)}


def _check_coded_linear(kernels, rows, out_features, bias, in_features=96, codes="q4_1"):
    """The block-code kernel equals the fp32 kernel on the dequantized weight bit for bit, plain and SwiGLU."""
    make, dtype = CODED_WEIGHTS[codes]
    weight = make(out_features, in_features, seed=rows)
    bias = torch.randn(out_features) if bias else None
    x = torch.randn(rows, in_features + 20)[:, 10:10 + in_features]  # strided rows
    packed = kernels.pack_coded_linear(weight)
    assert packed is not None and packed.dtype == dtype
    expected = kernels.f32_linear(x, kernels.pack_f32_linear(weight), bias)
    assert torch.equal(kernels.coded_linear(x, packed, bias), expected)
    if out_features % 32 == 0:
        ordered = None if bias is None else kernels.swiglu_order(bias)
        fused = kernels.coded_linear(x, kernels.pack_coded_linear(weight, swiglu=True), ordered, swiglu=True)
        plain = kernels.f32_linear(x, kernels.pack_f32_linear(weight, swiglu=True), ordered, swiglu=True)
        assert fused.shape == (rows, out_features // 2) and torch.equal(fused, plain)


@pytest.mark.parametrize("codes", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 16, 17, 33, 100])  # register-expanded (1-2 passes) and buffered
@pytest.mark.parametrize("out_features, bias", [(48, True), (64, False), (16, True)])
def test_the_coded_linear_equals_the_f32_linear_on_the_dequantized_weight(kernel, rows, out_features, bias, codes):
    _check_coded_linear(kernel, rows, out_features, bias, codes=codes)


@pytest.mark.parametrize("codes", ["q4_1", "q8_0"])
def test_the_coded_linear_handles_wide_inputs(kernel, codes):
    _check_coded_linear(kernel, 37, 64, True, in_features=1536, codes=codes)


@pytest.mark.parametrize("rows, in_features", [(700, 1536), (1500, 96)])  # x in several row chunks
def test_the_linears_walk_large_inputs_in_row_chunks(kernel, rows, in_features):
    """A prefill-sized x goes through the kernels a chunk of rows at a time (the coded kernel with runs
    of groups expanded at once: one group per run at 1,536 inputs, every group at 96): the same sums."""
    _check_f32_linear(kernel, rows, 96, True, in_features=in_features)
    _check_swiglu_linear(kernel, torch.float32, rows, 48, True, in_features=in_features)
    for codes in ("q4_1", "q8_0"):
        _check_coded_linear(kernel, rows, 96, True, in_features=in_features, codes=codes)


def test_weights_that_are_not_block_codes_are_not_packed_as_such(kernel):
    weight = q4_1_weight(64, 96)
    assert kernel.pack_coded_linear(torch.randn(64, 96)) is None  # full precision
    assert kernel.pack_coded_linear(weight[:, :80]) is None  # inputs not whole blocks of 32
    assert kernel.pack_coded_linear(weight[:48], swiglu=True) is None  # SwiGLU needs pairs of panels
    assert kernel.pack_coded_linear(weight.bfloat16()) is None
    for make in (q4_1_weight, q8_0_weight):
        nudged = make(64, 96)
        nudged[5, 40] = torch.nextafter(nudged[5, 40], torch.tensor(1.0))  # one weight off the grid
        assert kernel.pack_coded_linear(nudged) is None


def test_the_block_codes_are_recovered_exactly_including_constant_blocks():
    from hetero_core.model.block_codes import block_codes

    weight = q4_1_weight(80, 64)  # more rows than the quick probe looks at
    weight[7, :32] = -0.125  # a constant block: d = 0
    d, m, q, bits = block_codes(weight)
    assert bits == 4 and d.shape == m.shape == (80, 2) and q.shape == (80, 2, 32) and q.dtype == torch.uint8
    assert int(q.max()) <= 15 and float(d[7, 0]) == 0.0 and float(m[7, 0]) == -0.125
    assert torch.equal(d[..., None] * q.float() + m[..., None], weight.reshape(80, 2, 32))
    late = weight.clone()
    late[75, 3] += 1e-3  # beyond the probe's rows: still refused
    assert block_codes(late) is None
    eight = q8_0_weight(80, 64)
    eight[3, 32:] = 0.0  # an all-zero block
    d, m, q, bits = block_codes(eight)
    assert bits == 8 and q.dtype == torch.int8 and not m.any() and float(d[3, 1]) == 0.0
    assert torch.equal(d[..., None] * q.float(), eight.reshape(80, 2, 32))


def test_fp32_packed_linears_take_the_coded_kernel_for_block_code_weights(kernel):
    from hetero_core.model.cpu_linear import PackedLinear

    weight, bias = q4_1_weight(64, 96), torch.randn(64)
    linear = PackedLinear(weight, bias, kernel)
    assert linear.kernel_dtype == "codes" and linear.kernel_weight.dtype == torch.uint8
    assert (linear.in_features, linear.out_features) == (96, 64)
    plain = PackedLinear(torch.randn(64, 96), bias, kernel)
    assert plain.kernel_dtype == "f32"
    x = torch.randn(5, 96)
    assert torch.equal(linear(x), kernel.f32_linear(x, kernel.pack_f32_linear(weight), bias))
    again = PackedLinear.from_kernel_layout(linear.kernel_weight, bias, kernel)  # as a prepared file loads it
    assert again.kernel_dtype == "codes" and torch.equal(again(x), linear(x))
    swiglu = PackedLinear(q4_1_weight(64, 96), None, kernel, swiglu=True)
    assert swiglu.kernel_dtype == "codes" and swiglu.swiglu and swiglu(x).shape == (5, 32)
    head = PackedLinear(q8_0_weight(64, 96), None, kernel)  # an LM head tied to Q8_0 embeddings
    assert head.kernel_weight.dtype == torch.int8 and torch.equal(
        head(x), kernel.f32_linear(x, kernel.pack_f32_linear(q8_0_weight(64, 96)), None))


def _check_swiglu_linear(kernels, dtype, rows, intermediate, bias, in_features=200):
    """The linear with its SwiGLU epilogue gives exactly the unfused linear followed by silu_mul."""
    torch.manual_seed(rows + intermediate)
    weight = torch.randn(2 * intermediate, in_features).to(dtype)
    bias = torch.randn(2 * intermediate) if bias else None
    x = torch.randn(rows, in_features + 40)[:, 20:20 + in_features].to(dtype)  # strided rows
    ordered_bias = None if bias is None else kernels.swiglu_order(bias, dtype)
    if dtype == torch.float32:
        plain = kernels.silu_mul(kernels.f32_linear(x, kernels.pack_f32_linear(weight), bias))
        fused = kernels.f32_linear(x, kernels.pack_f32_linear(weight, swiglu=True), ordered_bias, swiglu=True)
    else:
        plain = kernels.silu_mul(kernels.bf16_linear(x, kernels.pack_bf16_linear(weight), bias))
        fused = kernels.bf16_linear(x, kernels.pack_bf16_linear(weight, swiglu=True), ordered_bias, swiglu=True)
    assert fused.shape == (rows, intermediate) and fused.dtype == dtype
    assert torch.equal(fused, plain)


@pytest.mark.parametrize("rows", [1, 3, 6, 7, 13, 40])
@pytest.mark.parametrize("intermediate, bias", [(16, True), (48, False), (96, True)])  # 48: a partial group
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_linears_swiglu_epilogue_equals_the_linear_then_silu_mul(kernel, dtype, rows, intermediate, bias):
    if dtype == torch.bfloat16 and not kernel.has_bf16_linear:
        pytest.skip("the kernels were built without AVX-512 BF16 (this CPU, -march=native), so no bf16 linear")
    _check_swiglu_linear(kernel, dtype, rows, intermediate, bias)


@pytest.mark.parametrize("in_features", [96, 4098])
def test_a_packed_gate_up_projection_returns_the_swiglu_activation(kernel, in_features):
    """Packed with ``swiglu``, the MLP's gate/up projection returns silu(gate) * up for any number of
    rows: inside the kernels' linear, or after oneDNN's (rows beyond FEW_ROWS of a wide layer)."""
    from hetero_core.model.cpu_linear import FEW_ROWS, PackedLinear, pack_linears
    from hetero_core.model.layers import SwiGLU

    torch.manual_seed(1)
    weight, bias = torch.randn(2 * 48, in_features), torch.randn(2 * 48)
    linear = PackedLinear(weight, bias, kernel, swiglu=True)
    assert linear.swiglu and linear.out_features == 96
    for rows in (1, FEW_ROWS + 1):
        x = torch.randn(rows, in_features)
        gate, up = torch.nn.functional.linear(x.double(), weight.double(), bias.double()).chunk(2, dim=-1)
        expected = (torch.nn.functional.silu(gate) * up).float()
        torch.testing.assert_close(linear(x), expected, rtol=1e-2, atol=1e-2)  # fp32 sums of 4,098 terms
    assert not PackedLinear(torch.randn(48, 64), None, kernel, swiglu=True).swiglu  # 48 rows: not pairs of panels
    mlp = SwiGLU(64, 48, bias=False)
    expected = mlp(x64 := torch.randn(5, 64))
    pack_linears(mlp, kernel)
    assert mlp.gate_up_proj.swiglu and not mlp.down_proj.swiglu
    assert (mlp(x64) - expected).abs().max().item() < 1e-4


def test_the_linear_takes_the_swiglu_activation_where_it_runs(kernel):
    """fp32 on every CPU, bf16 where the kernels have their bf16 linear."""
    from hetero_core.model.cpu_linear import PackedLinear

    assert kernel.fuses_swiglu(torch.float32)
    assert kernel.fuses_swiglu(torch.bfloat16) == kernel.has_bf16_linear
    assert not kernel.fuses_swiglu(torch.float16)
    linear = PackedLinear(torch.randn(64, 32), None, kernel, swiglu=True)
    assert linear.swiglu == kernel.fuses_swiglu(torch.float32) and linear.kernel_dtype == "f32"


@pytest.mark.parametrize("march", ["x86-64", "sandybridge", "haswell"])  # SSE (4 lanes), AVX (8, no AVX2), AVX2
def test_kernels_built_for_narrower_vectors_agree(kernel, monkeypatch, tmp_path, march):
    """The kernels pick their vector width from the ISA they are compiled for; built here for a
    baseline x86, for AVX without AVX2 and for AVX2 (machines without AVX-512 get these), they give
    the same answers."""
    import platform

    from hetero_core.model.compute_dtype import cpu_flags

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 -march values")
    if march == "haswell" and not {"avx2", "fma", "bmi2"} <= cpu_flags():
        pytest.skip("this CPU cannot run code built for haswell (AVX2, FMA, BMI2)")
    if march == "sandybridge" and "avx" not in cpu_flags():
        pytest.skip("this CPU cannot run code built for sandybridge (AVX)")
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    flags = tuple(f"-march={march}" if flag == "-march=native" else flag for flag in cpu_kernels_module.CFLAGS)
    monkeypatch.setattr(cpu_kernels_module, "CFLAGS", flags)
    cpu_kernels_module._load.cache_clear()
    try:
        narrow = load_cpu_kernels(required=True)
        assert not narrow.has_bf16_linear and narrow.fuses_swiglu(torch.float32)
        for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            pool = BlockPool(128, shuffle=True, seed=2)
            fresh = [PagedSequence(i, list(range(n)), n) for i, n in enumerate([3, 17, 70])]
            continued = [PagedSequence(5, list(range(90)), 90)]
            step([(continued[0], 33)], pool, 16)
            batch = step([(seq, seq.num_remaining) for seq in [*fresh, *continued]], pool, 16)
            (out, _), (expected, _) = _forward_both(narrow, batch, 128, 3, 3, 64, 16, dtype)
            assert (out.float() - expected.float()).abs().max().item() < tolerance
            decode_batch, cache, query = _decode_step([1, 16, 17, 97], 2, 4, 128, 16, dtype)
            out, expected = _both_paths(narrow, decode_batch, cache, query)
            assert (out.float() - expected.float()).abs().max().item() < tolerance
        test_the_element_wise_kernels_match_the_torch_layers(narrow, torch.bfloat16, 2e-2, 200)
        for rows in (1, 2, 3, 7, 13, 40):
            _check_f32_linear(narrow, rows, 48, True)
            _check_swiglu_linear(narrow, torch.float32, rows, 48, True)
            _check_coded_linear(narrow, rows, 64, True)
            _check_coded_linear(narrow, rows, 64, True, codes="q8_0")
        _check_f32_linear(narrow, 700, 48, True, in_features=1536)  # several row chunks
        _check_coded_linear(narrow, 700, 64, True, in_features=1536)
    finally:
        cpu_kernels_module._load.cache_clear()
