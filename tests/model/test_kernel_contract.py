"""Every entry point of the compiled CPU kernels by contract: zero, one and odd numbers of rows, tokens
and sequences, odd widths, heads, groups, contexts and block sizes, in fp32 and bf16, in this CPU's
build and the narrow ones (SSE, AVX, AVX2): the right shape and values (float64 references), nothing
written for nothing asked, and a clear error (never a crash) for what does not fit. A step that
samples no row of a block-code model had crashed the process with SIGFPE (``coded_linear`` at 0 rows).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from tests.model.kernel_builds import BUILDS, kernels_for
from tests.model.kernel_weights import CODED_WEIGHTS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ROWS = (0, 1, 7, 13)


@pytest.fixture(params=BUILDS)
def kernels(request, tmp_path_factory):
    return kernels_for(request.param, tmp_path_factory.getbasetemp() / "kernel_builds")


def _tolerance(dtype: torch.dtype, expected: torch.Tensor) -> torch.Tensor:
    return 1e-4 * (1 + expected.abs()) if dtype == torch.float32 else 0.02 * expected.abs() + 0.03


# ---- linears ----

LINEARS = {  # name -> (weight dtype, K values: 0 and odd where the layout allows)
    "f32": (torch.float32, (0, 1, 7, 64)),
    "q4_1": (torch.float32, (32, 96)),
    "q8_0": (torch.float32, (32, 96)),
    "bf16": (torch.bfloat16, (0, 2, 6, 64)),
}


def _pack_and_run(kernels, kind: str, weight: torch.Tensor, bias, x: torch.Tensor, swiglu: bool):
    if kind == "f32":
        return kernels.f32_linear(x, kernels.pack_f32_linear(weight, swiglu), bias, swiglu)
    if kind == "bf16":
        return kernels.bf16_linear(x, kernels.pack_bf16_linear(weight, swiglu), bias, swiglu=swiglu)
    packed = kernels.pack_coded_linear(weight, swiglu)
    assert packed is not None and packed.dtype == CODED_WEIGHTS[kind][1]
    return kernels.coded_linear(x, packed, bias, swiglu)


@pytest.mark.parametrize("kind", LINEARS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features, swiglu", [(16, False), (48, False), (32, True), (96, True)])
def test_the_linears_take_any_rows_and_every_input_width_their_layout_allows(
    kernels, kind, rows, out_features, swiglu
):
    dtype, widths = LINEARS[kind]
    for in_features in widths:
        torch.manual_seed(rows * 100 + in_features)
        if kind in CODED_WEIGHTS:
            weight = CODED_WEIGHTS[kind][0](out_features, in_features, seed=rows)
        else:
            weight = torch.randn(out_features, in_features).to(dtype)
        bias = torch.randn(out_features) if out_features != 48 else None
        x = torch.randn(rows, in_features).to(dtype)
        ordered = None if bias is None or not swiglu else kernels.swiglu_order(bias, dtype)
        out = _pack_and_run(kernels, kind, weight, ordered if swiglu else bias, x, swiglu)
        full = x.double() @ weight.double().T + (0 if bias is None else bias.double())
        if swiglu:
            gate, up = full.chunk(2, dim=-1)
            full = torch.nn.functional.silu(gate) * up
        assert out.shape == (rows, full.shape[1]) and out.dtype == dtype, (in_features, out.shape)
        assert ((out.double() - full).abs() <= _tolerance(dtype, full)).all(), in_features


def test_the_linears_refuse_what_does_not_fit_with_a_clear_error(kernels):
    weight = torch.randn(32, 64)
    for name, dtype, pack in (
        ("f32_linear", torch.float32, kernels.pack_f32_linear),
        ("bf16_linear", torch.bfloat16, kernels.pack_bf16_linear),
    ):
        packed = pack(weight.to(dtype))
        with pytest.raises(ValueError, match=rf"{name}: x must be a CPU .* \[rows, 64\], got .* \(3, 63\)"):
            getattr(kernels, name)(torch.randn(3, 63).to(dtype), packed, None)
        with pytest.raises(ValueError, match=f"{name}: x must be"):
            getattr(kernels, name)(torch.randn(3, 64).half(), packed, None)
        with pytest.raises(ValueError, match=f"{name}: bias must be a contiguous float32 \\[32\\]"):
            getattr(kernels, name)(torch.randn(3, 64).to(dtype), packed, torch.randn(31))
    assert kernels.pack_bf16_linear(torch.randn(32, 7).bfloat16()) is None  # odd K: no bf16 layout
    assert kernels.pack_f32_linear(torch.randn(40, 64)) is None  # outputs not whole panels
    library, x, y = kernels.library, torch.randn(4, 64), torch.empty(4, 64)
    for n, k, swiglu in ((40, 64, 0), (48, 64, 1), (-16, 64, 0), (16, -1, 0)):  # the C entry points check too
        assert library.f32_linear(x.data_ptr(), 64, None, None, y.data_ptr(), 64, 4, n, k, swiglu, 1) == -1
        assert (
            library.bf16_linear(x.data_ptr(), 64, None, None, y.data_ptr(), 64, 4, n, k, 0, swiglu, 1) == -1
        )
    assert (
        library.bf16_linear(x.data_ptr(), 64, None, None, y.data_ptr(), 64, 4, 16, 63, 0, 0, 1) == -1
    )  # odd K
    assert (
        library.coded_linear(x.data_ptr(), 64, None, None, y.data_ptr(), 64, 4, 16, 48, 4, 0, 1) == -1
    )  # K % 32
    assert (
        library.coded_linear(x.data_ptr(), 64, None, None, y.data_ptr(), 64, 4, 16, 64, 5, 0, 1) == -1
    )  # bits


# ---- attention ----


def _paged(lengths, num_kv_heads, head_dim, block_size, dtype, seed):
    """Caches holding ``lengths`` tokens per sequence over shuffled blocks, and their block tables."""
    generator = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables, at = [], 0
    for count in blocks:
        tables.append(order[at : at + count])
        at += count
    width = max(blocks, default=1) or 1
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables] or [[0]], dtype=torch.long)[
        : len(lengths)
    ]
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    caches = [torch.randn(shape, generator=generator).to(dtype) for _ in range(2)]
    return caches, table.contiguous()


def _reference(query_row, key_cache, value_cache, table_row, visible, block_size, group, scale):
    """Attention of one token's heads [heads, dim] over its first ``visible`` keys, in float64."""
    positions = torch.arange(visible)
    slots = table_row[positions // block_size] * block_size + positions % block_size
    keys = key_cache.flatten(1, 2)[:, slots].double()  # [kv_heads, visible, dim]
    values = value_cache.flatten(1, 2)[:, slots].double()
    keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
    weights = torch.softmax(torch.einsum("hd,hkd->hk", query_row.double() * scale, keys), dim=-1)
    return torch.einsum("hk,hkd->hd", weights, values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "num_kv_heads, group, head_dim, block_size", [(1, 1, 16, 1), (3, 3, 64, 3), (1, 7, 48, 16)]
)
@pytest.mark.parametrize("lengths", [[], [1], [1, 17, 63, 65, 130]])  # no sequence, one token, odd contexts
def test_decode_attention_takes_any_number_of_sequences_and_odd_shapes(
    kernels, dtype, num_kv_heads, group, head_dim, block_size, lengths
):
    dtype = DTYPES[dtype]
    (key_cache, value_cache), tables = _paged(
        lengths, num_kv_heads, head_dim, block_size, dtype, seed=len(lengths)
    )
    query = torch.randn(len(lengths), num_kv_heads * group, head_dim).to(dtype)
    context_lens = torch.tensor(lengths, dtype=torch.long)
    out = kernels.attend_decode(query, key_cache, value_cache, tables, context_lens, head_dim**-0.5)
    assert out.shape == query.shape and out.dtype == dtype
    for s, length in enumerate(lengths):
        expected = _reference(
            query[s], key_cache, value_cache, tables[s], length, block_size, group, head_dim**-0.5
        )
        assert ((out[s].double() - expected).abs() <= _tolerance(dtype, expected)).all(), (s, length)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "num_kv_heads, group, head_dim, block_size", [(1, 1, 16, 1), (3, 3, 64, 3), (1, 7, 48, 16)]
)
@pytest.mark.parametrize(
    "chunks", [[], [(1, 1)], [(2, 2), (1, 3), (17, 40), (65, 65)]]
)  # (query_len, context)
def test_prefill_attention_takes_any_number_of_sequences_and_odd_shapes(
    kernels, dtype, num_kv_heads, group, head_dim, block_size, chunks
):
    from hetero_core.model.cpu.kernel_attention import PrefillSequences

    dtype = DTYPES[dtype]
    contexts = [context for _, context in chunks]
    (key_cache, value_cache), tables = _paged(
        contexts, num_kv_heads, head_dim, block_size, dtype, seed=len(chunks)
    )
    lens = [query_len for query_len, _ in chunks]
    num_tokens = sum(lens) + 1  # one row of another sequence, left alone
    query = torch.randn(num_tokens, num_kv_heads * group, head_dim).to(dtype)
    starts = [sum(lens[:i]) + 1 for i in range(len(lens))]
    seqs = PrefillSequences(
        torch.tensor(starts, dtype=torch.long),
        torch.tensor(lens, dtype=torch.long),
        torch.tensor(contexts, dtype=torch.long),
        tables,
    )
    out = torch.full_like(query, 7.0)
    kernels.attend_prefill(query, key_cache, value_cache, seqs, head_dim**-0.5, out)
    assert out[0].eq(7.0).all()
    for s, (query_len, context) in enumerate(chunks):
        for j in range(query_len):
            row = starts[s] + j
            expected = _reference(
                query[row],
                key_cache,
                value_cache,
                tables[s],
                context - query_len + j + 1,
                block_size,
                group,
                head_dim**-0.5,
            )
            assert ((out[row].double() - expected).abs() <= _tolerance(dtype, expected)).all(), (s, j)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [0, 1, 7])
def test_the_kv_write_takes_any_number_of_tokens(kernels, dtype, num_tokens):
    dtype = DTYPES[dtype]
    key_cache, value_cache = torch.zeros(3, 4, 5, 16, dtype=dtype), torch.zeros(3, 4, 5, 16, dtype=dtype)
    rows = torch.randn(num_tokens, 3 * 3, 16).to(dtype)  # key and value: strided slices of one tensor
    key, value = rows[:, 3:6], rows[:, 6:9]
    slots = torch.randperm(20)[:num_tokens]
    kernels.write_kv(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache.view(3, 20, 16)[:, slots], key.transpose(0, 1))
    assert torch.equal(value_cache.view(3, 20, 16)[:, slots], value.transpose(0, 1))
    assert int(key_cache.ne(0).any(-1).sum()) == 3 * num_tokens


def test_attention_refuses_inconsistent_inputs_with_a_clear_error(kernels):
    from hetero_core.model.cpu.kernel_attention import PrefillSequences

    (key_cache, value_cache), tables = _paged([5, 9], 2, 16, 4, torch.float32, seed=0)
    query = torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match="refused its inputs"):  # a context beyond its block table
        kernels.attend_decode(query, key_cache, value_cache, tables, torch.tensor([5, 99]), 0.25)
    with pytest.raises(ValueError, match="refused its inputs"):  # a block outside the cache
        kernels.attend_decode(
            query, key_cache, value_cache, torch.full_like(tables, 1000), torch.tensor([5, 9]), 0.25
        )
    with pytest.raises(ValueError, match="context_lens must be a contiguous int64"):
        kernels.attend_decode(
            query, key_cache, value_cache, tables, torch.tensor([5, 9], dtype=torch.int32), 0.25
        )
    with pytest.raises(ValueError, match=r"the caches must be contiguous CPU bfloat16 .* got float32 \(2, "):
        kernels.attend_decode(query.bfloat16(), key_cache, value_cache, tables, torch.tensor([5, 9]), 0.25)
    seqs = PrefillSequences(
        torch.tensor([0]), torch.tensor([3]), torch.tensor([2]), tables[:1]
    )  # query > context
    with pytest.raises(ValueError, match="refused its inputs"):
        kernels.attend_prefill(
            torch.randn(3, 4, 16), key_cache, value_cache, seqs, 0.25, torch.empty(3, 4, 16)
        )
    seqs = PrefillSequences(torch.tensor([2]), torch.tensor([3]), torch.tensor([5]), tables[:1])
    with pytest.raises(ValueError, match="beyond the query's 3 tokens"):
        kernels.attend_prefill(
            torch.randn(3, 4, 16), key_cache, value_cache, seqs, 0.25, torch.empty(3, 4, 16)
        )


# ---- element-wise ----


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("width", [1, 7, 16, 40])
def test_the_element_wise_kernels_take_any_rows_and_widths(kernels, dtype, rows, width):
    dtype = DTYPES[dtype]
    torch.manual_seed(rows + width)
    x, residual, weight = torch.randn(rows, width), torch.randn(rows, width), torch.rand(width) + 0.5
    summed = residual.to(dtype).double() + x.to(dtype).double()
    updated = residual.to(dtype)
    normed = kernels.rms_norm(x.to(dtype), weight.to(dtype), 1e-6, updated)
    reference = summed / (summed.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * weight.to(dtype).double()
    assert (
        normed.shape == (rows, width)
        and ((normed.double() - reference).abs() <= _tolerance(dtype, reference)).all()
    )
    assert ((updated.double() - summed).abs() <= _tolerance(dtype, summed)).all()
    gate_up = torch.randn(rows, 2 * width).to(dtype)
    gate, up = gate_up.double().chunk(2, dim=-1)
    swiglu = torch.nn.functional.silu(gate) * up
    out = kernels.silu_mul(gate_up)
    assert out.shape == (rows, width) and ((out.double() - swiglu).abs() <= _tolerance(dtype, swiglu)).all()
    heads = torch.randn(rows, 3, 2 * width).to(dtype)
    cos, sin = torch.randn(rows, 1, width).to(dtype), torch.randn(rows, 1, width).to(dtype)
    first, second = heads.double().chunk(2, dim=-1)
    rotated = torch.cat(
        [first * cos.double() - second * sin.double(), second * cos.double() + first * sin.double()], -1
    )
    kernels.rotary_(heads, cos, sin)
    assert ((heads.double() - rotated).abs() <= _tolerance(dtype, rotated)).all()


def test_the_element_wise_kernels_refuse_what_does_not_fit(kernels):
    with pytest.raises(ValueError, match=r"rms_norm: .* needs a contiguous weight \[8\]"):
        kernels.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match=r"rotary_: .* cos and sin \[2, 1, 4\]"):
        kernels.rotary_(torch.randn(2, 3, 8), torch.randn(2, 1, 3), torch.randn(2, 1, 3))
    for name in ("rms_norm_f32", "silu_mul_f32", "rotary_f32"):
        assert getattr(kernels.library, name).restype is ctypes.c_int


# ---- the fused decode step ----


def test_the_fused_decode_step_does_nothing_for_no_rows(kernels, tiny_model_dirs, make_executor, monkeypatch):
    """``decode_layers`` at 0 rows returns at once; at 1 and 3 rows it runs (test_fused_decode.py
    compares its results with the model code's, bit for bit)."""
    from hetero_core.default_plugins.torch_options import TorchExecutorOptions
    from hetero_core.model.cpu import kernels as cpu_kernels_module
    from hetero_core.model.cpu.fused_decode import _Step

    monkeypatch.setattr(cpu_kernels_module, "load_cpu_kernels", lambda required=False, **_: kernels)
    model_dir, _ = tiny_model_dirs["llama_wide_heads"]
    executor = make_executor(
        model_dir, options=TorchExecutorOptions(dtype="float32", prepared_weights_cache=False)
    )
    fused = executor.model.fused_decode
    assert fused is not None and fused.kernels is kernels
    empty = _Step(0, 1, None, None, None, None, None, None, None, None, None, None, None, 1)
    assert kernels.library.decode_layers(ctypes.byref(fused._model), ctypes.byref(empty)) == 0
