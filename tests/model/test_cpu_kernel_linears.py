"""The compiled kernels' linears (fp32, block codes, bf16) against float64 references, and which
layer takes which kernel."""

from __future__ import annotations

import pytest
import torch

from tests.model.kernel_builds import BUILDS, kernels_for
from tests.model.kernel_weights import CODED_WEIGHTS, q4_1_weight, q8_0_weight


@pytest.fixture
def kernel(cpu_kernels):
    return cpu_kernels


@pytest.mark.parametrize("rows", [1, 5, 12, 13, 17, 33, 64])
@pytest.mark.parametrize(
    "out_features, bias", [(48, True), (96, False)]
)  # 48: an odd number of 16-column panels
def test_the_bf16_linear_matches_an_fp32_reference(kernel, rows, out_features, bias):
    torch.manual_seed(rows)
    weight = torch.randn(out_features, 200).bfloat16()
    bias_f32 = torch.randn(out_features) if bias else None
    x = torch.randn(rows, 260).bfloat16()[:, 30:230]  # strided rows
    packed = kernel.pack_bf16_linear(weight)
    out = kernel.bf16_linear(x, packed, bias_f32)
    expected = x.float() @ weight.float().T + (0 if bias_f32 is None else bias_f32)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, out_features)
    assert (
        (out.float() - expected).abs() <= 0.01 * expected.abs() + 0.05
    ).all()  # bf16 rounding of the output
    exact = kernel.bf16_linear(x, packed, bias_f32, torch.float32)  # fp32 sums, as for logits
    assert exact.dtype == torch.float32 and (exact - expected).abs().max().item() < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_features", [96, 4098])
def test_packed_linears_take_the_kernel_for_every_input(kernel, dtype, in_features):
    """The kernels' linear takes every call, whatever its rows and inputs (one kernel at every batch
    size: batch invariance), and no oneDNN copy of the weight is kept."""
    from hetero_core.model.cpu.linear import PackedLinear

    torch.manual_seed(0)
    weight, bias = torch.randn(64, in_features).to(dtype), torch.randn(64).to(dtype)
    linear = PackedLinear(weight, bias, kernel)
    layout = "f32" if dtype == torch.float32 else "bf16"
    assert linear.kernel_dtype == layout and linear.all_rows and linear.packed_weight is None
    assert PackedLinear(weight, bias, None).kernel_weight is None  # no kernels: oneDNN
    assert PackedLinear(torch.randn(40, 96).to(dtype), None, kernel).kernel_weight is None  # 40 % 16: oneDNN
    method = "f32_linear" if dtype == torch.float32 else "bf16_linear"
    calls = []
    original = getattr(kernel, method)
    for rows in (1, 65, 300):
        x = torch.randn(rows, in_features).to(dtype)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                type(kernel), method, lambda self, *args, **kw: calls.append(rows) or original(*args, **kw)
            )
            out = linear(x)
        expected = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        tolerance = (
            1e-4 * in_features**0.5
            if dtype == torch.float32
            else 0.01 * expected.abs() + 0.05 * in_features**0.5 / 10
        )
        assert out.shape == (rows, 64) and out.dtype == dtype
        assert ((out.double() - expected).abs() <= tolerance).all()
    assert calls == [1, 65, 300]


def _check_f32_linear(kernels, rows, out_features, bias, in_features=200):
    torch.manual_seed(rows)
    weight = torch.randn(out_features, in_features)
    bias = torch.randn(out_features) if bias else None
    x = torch.randn(rows, in_features + 60)[:, 30 : 30 + in_features]  # strided rows
    out = kernels.f32_linear(x, kernels.pack_f32_linear(weight), bias)
    expected = (x.double() @ weight.double().T + (0 if bias is None else bias.double())).float()
    assert out.dtype == torch.float32 and out.shape == (rows, out_features)
    assert (out - expected).abs().max().item() < 1e-4 * in_features**0.5


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 12, 13, 17, 33, 64, 100])
@pytest.mark.parametrize(
    "out_features, bias", [(48, True), (96, False), (16, True)]
)  # 48, 16: partial panel groups
def test_the_f32_linear_matches_a_float64_reference(kernel, rows, out_features, bias):
    _check_f32_linear(kernel, rows, out_features, bias)


def _check_coded_linear(kernels, rows, out_features, bias, in_features=96, codes="q4_1"):
    """The block-code kernel equals the fp32 kernel on the dequantized weight bit for bit, plain
    and SwiGLU."""
    make, dtype = CODED_WEIGHTS[codes]
    weight = make(out_features, in_features, seed=rows)
    bias = torch.randn(out_features) if bias else None
    x = torch.randn(rows, in_features + 20)[:, 10 : 10 + in_features]  # strided rows
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
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 16, 17, 33, 100])  # codes in registers or buffered (AVX2)
@pytest.mark.parametrize("out_features, bias", [(48, True), (64, False), (16, True)])
def test_the_coded_linear_equals_the_f32_linear_on_the_dequantized_weight(
    kernel, rows, out_features, bias, codes
):
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
    from hetero_core.model.cpu.block_codes import block_codes

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
    """With fp32 code activations (``code_activations = "float"``) the codes give the fp32 weights' bits."""
    import dataclasses

    from hetero_core.model.cpu.linear import PackedLinear

    kernel = dataclasses.replace(kernel, code_activations="float")

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
        head(x), kernel.f32_linear(x, kernel.pack_f32_linear(q8_0_weight(64, 96)), None)
    )


def _check_swiglu_linear(kernels, dtype, rows, intermediate, bias, in_features=200):
    """The linear with its SwiGLU epilogue gives exactly the unfused linear followed by silu_mul."""
    torch.manual_seed(rows + intermediate)
    weight = torch.randn(2 * intermediate, in_features).to(dtype)
    bias = torch.randn(2 * intermediate) if bias else None
    x = torch.randn(rows, in_features + 40)[:, 20 : 20 + in_features].to(dtype)  # strided rows
    ordered_bias = None if bias is None else kernels.swiglu_order(bias, dtype)
    if dtype == torch.float32:
        plain = kernels.silu_mul(kernels.f32_linear(x, kernels.pack_f32_linear(weight), bias))
        fused = kernels.f32_linear(x, kernels.pack_f32_linear(weight, swiglu=True), ordered_bias, swiglu=True)
    else:
        plain = kernels.silu_mul(kernels.bf16_linear(x, kernels.pack_bf16_linear(weight), bias))
        fused = kernels.bf16_linear(
            x, kernels.pack_bf16_linear(weight, swiglu=True), ordered_bias, swiglu=True
        )
    assert fused.shape == (rows, intermediate) and fused.dtype == dtype
    assert torch.equal(fused, plain)


@pytest.mark.parametrize("rows", [1, 3, 6, 7, 13, 40])
@pytest.mark.parametrize("intermediate, bias", [(16, True), (48, False), (96, True)])  # 48: a partial group
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_linears_swiglu_epilogue_equals_the_linear_then_silu_mul(kernel, dtype, rows, intermediate, bias):
    _check_swiglu_linear(kernel, dtype, rows, intermediate, bias)


@pytest.mark.parametrize("in_features", [96, 4098])
def test_a_packed_gate_up_projection_returns_the_swiglu_activation(kernel, in_features):
    """Packed with ``swiglu``, the MLP's gate/up projection returns silu(gate) * up for any number of
    rows, inside the kernels' linear."""
    from hetero_core.model.cpu.linear import PackedLinear, pack_linears
    from hetero_core.model.layers import SwiGLU

    torch.manual_seed(1)
    weight, bias = torch.randn(2 * 48, in_features), torch.randn(2 * 48)
    linear = PackedLinear(weight, bias, kernel, swiglu=True)
    assert linear.swiglu and linear.out_features == 96
    for rows in (1, 65):
        x = torch.randn(rows, in_features)
        gate, up = torch.nn.functional.linear(x.double(), weight.double(), bias.double()).chunk(2, dim=-1)
        expected = (torch.nn.functional.silu(gate) * up).float()
        torch.testing.assert_close(linear(x), expected, rtol=1e-2, atol=1e-2)  # fp32 sums of 4,098 terms
    assert not PackedLinear(
        torch.randn(48, 64), None, kernel, swiglu=True
    ).swiglu  # 48 rows: not pairs of panels
    mlp = SwiGLU(64, 48, bias=False)
    expected = mlp(x64 := torch.randn(5, 64))
    pack_linears(mlp, kernel)
    assert mlp.gate_up_proj.swiglu and not mlp.down_proj.swiglu
    assert (mlp(x64) - expected).abs().max().item() < 1e-4


def test_the_linears_take_the_swiglu_activation_in_both_dtypes(kernel):
    from hetero_core.model.cpu.linear import PackedLinear

    assert kernel.fuses_swiglu(torch.float32) and kernel.fuses_swiglu(torch.bfloat16)
    assert not kernel.fuses_swiglu(torch.float16)
    for dtype, layout in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        linear = PackedLinear(torch.randn(64, 32).to(dtype), None, kernel, swiglu=True)
        assert linear.swiglu and linear.kernel_dtype == layout


@pytest.mark.parametrize("build", BUILDS[1:])  # SSE (4 lanes), AVX (8, no AVX2 or FMA), AVX2
def test_linears_built_for_narrower_vectors_agree(build, tmp_path_factory):
    """Every linear (fp32, block codes, bf16 with its weight widened to fp32) built for a baseline x86,
    AVX without AVX2 and AVX2 matches the references as the native build does."""
    narrow = kernels_for(build, tmp_path_factory.getbasetemp() / "kernel_builds")
    for rows in (1, 2, 3, 7, 13, 40):
        _check_f32_linear(narrow, rows, 48, True)
        _check_swiglu_linear(narrow, torch.float32, rows, 48, True)
        _check_swiglu_linear(narrow, torch.bfloat16, rows, 48, True)
        _check_coded_linear(narrow, rows, 64, True)
        _check_coded_linear(narrow, rows, 64, True, codes="q8_0")
        test_the_bf16_linear_matches_an_fp32_reference(narrow, rows, 48, True)
    _check_f32_linear(narrow, 700, 48, True, in_features=1536)  # several row chunks
    _check_coded_linear(narrow, 700, 64, True, in_features=1536)
