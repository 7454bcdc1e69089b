"""``q8a_coded_linear``: block-code weights (4-bit, 8-bit, 8-bit with a scale per 16 inputs) against
int8 activations, summed in integers. Its results equal a replay of its arithmetic (``q8a_reference``),
are batch-invariant (a row's bits do not depend on its batch-mates or the thread count), and are the
same bits on every build with FMA (VNNI, AVX2, plain int32 vectors)."""

from __future__ import annotations

import pytest
import torch

from hetero_core.model.cpu.code_panels import pack_code_panels_sub16
from tests.model.kernel_builds import kernels_for
from tests.model.q8a_reference import FORMATS, dequantized, pack_codes, random_codes, reference


@pytest.fixture
def kernel(cpu_kernels):
    return cpu_kernels


def _x(rows: int, in_features: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features + 24, generator=g)[:, 8 : 8 + in_features]  # strided rows
    x[:, 40:72] = 0.0  # an all-zero block: scale 0
    return x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 33])
@pytest.mark.parametrize("out_features, bias", [(48, True), (64, False), (16, True)])  # 48: a partial group
def test_the_int8_activation_linear_replays_its_reference_exactly(kernel, fmt, rows, out_features, bias):
    d, m, q, packed = random_codes(fmt, out_features, 192, seed=rows)
    bias = torch.randn(out_features) if bias else None
    x = _x(rows, 192, seed=out_features)
    out = kernel.q8a_coded_linear(x, packed, bias)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    assert torch.equal(out, reference(x, d, m, q, bias))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_int8_activations_stay_close_to_the_fp32_activation_kernel(kernel, fmt):
    """The same packed weight through coded_linear (fp32 activations, exact) differs only by the
    activations' rounding: a few 2^-8 of each block's largest value."""
    d, m, q, packed = random_codes(fmt, 64, 512)
    x = torch.randn(9, 512)
    exact = x.double() @ dequantized(d, m, q).double().T
    assert torch.equal(
        kernel.coded_linear(x, packed, None),
        kernel.f32_linear(x, kernel.pack_f32_linear(dequantized(d, m, q)), None),
    )
    error = (kernel.q8a_coded_linear(x, packed, None).double() - exact).abs().max()
    assert error < 0.02 * exact.abs().max()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rows_result_does_not_depend_on_its_batch_or_threads(kernel, fmt):
    d, m, q, packed = random_codes(fmt, 96, 576, seed=3)
    bias = torch.randn(96)
    x = torch.randn(65, 576, generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([kernel.q8a_coded_linear(x[r : r + 1], packed, bias) for r in range(65)])
        torch.set_num_threads(max(2, threads))
        for rows in (2, 3, 4, 5, 7, 9, 17, 32, 33, 65):
            for start in (0, 65 - rows):
                batch = kernel.q8a_coded_linear(x[start : start + rows], packed, bias)
                assert torch.equal(batch, alone[start : start + rows]), (rows, start)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 4, 7, 40])
def test_the_swiglu_epilogue_equals_the_linear_then_silu_mul(kernel, fmt, rows):
    d, m, q, plain_weight = random_codes(fmt, 96, 128, seed=rows)
    bias = torch.randn(96)
    x = _x(rows, 128)
    ordered = kernel.swiglu_order(bias)
    order = kernel.swiglu_order
    fused_weight = pack_codes(order(d), None if m is None else order(m), order(q))
    for dtype in (torch.float32, torch.bfloat16):
        plain = kernel.silu_mul(kernel.q8a_coded_linear(x.to(dtype), plain_weight, bias, out_dtype=dtype))
        fused = kernel.q8a_coded_linear(x.to(dtype), fused_weight, ordered, swiglu=True, out_dtype=dtype)
        assert fused.shape == (rows, 48) and fused.dtype == dtype
        assert torch.equal(fused, plain)


def test_bf16_activations_and_outputs(kernel):
    """bf16 x is quantized from its values as fp32 x would be; a bf16 output is the fp32 one rounded."""
    d, m, q, packed = random_codes("q4", 64, 96)
    x = _x(6, 96).bfloat16()
    fp32 = kernel.q8a_coded_linear(x.float(), packed, None)
    assert torch.equal(kernel.q8a_coded_linear(x, packed, None), fp32)
    assert torch.equal(kernel.q8a_coded_linear(x, packed, None, out_dtype=torch.bfloat16), fp32.bfloat16())


def test_the_sub16_layout_runs_exactly_in_the_fp32_activation_kernel(kernel):
    """coded_linear over the 16-input layout equals f32_linear on the dequantized weight bit for bit."""
    d, m, q, packed = random_codes("q8_sub16", 48, 160)
    assert packed.shape == (3, 10, 320) and packed.dtype == torch.int8
    x = _x(11, 160)
    assert torch.equal(
        kernel.coded_linear(x, packed, None),
        kernel.f32_linear(x, kernel.pack_f32_linear(dequantized(d, m, q)), None),
    )


def test_bad_inputs_are_clear_errors(kernel):
    _, _, _, packed = random_codes("q4", 32, 64)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        kernel.q8a_coded_linear(torch.zeros(2, 64, dtype=torch.float16), packed, None)
    with pytest.raises(ValueError, match=r"\[rows, 64\]"):
        kernel.q8a_coded_linear(torch.zeros(2, 65), packed, None)
    _, _, _, odd = random_codes("q8_sub16", 32, 48)  # 3 blocks of 16: not whole activation blocks
    with pytest.raises(ValueError, match="whole blocks of 32"):
        kernel.q8a_coded_linear(torch.zeros(2, 48), odd, None)
    with pytest.raises(ValueError, match="multiple of"):
        pack_code_panels_sub16(torch.zeros(8, 2), torch.zeros(8, 2, 16, dtype=torch.int8))
    assert kernel.q8a_coded_linear(torch.zeros(0, 64), packed, None).shape == (0, 32)


@pytest.mark.parametrize("build", ["haswell", "skylake-avx512", "x86-64", "sandybridge"])
def test_every_build_sums_the_same_integers(kernel, build, tmp_path_factory):
    """AVX2's VPMADDUBSW sums and the plain int32 ones (AVX-512 without VNNI, SSE, AVX) are the native
    build's exactly: the same bits where the build has FMA, within fp32 rounding where it has none."""
    narrow = kernels_for(build, tmp_path_factory.getbasetemp() / "kernel_builds")
    assert narrow.q8a_path == {"haswell": "avx2"}.get(build, "int32")
    for fmt in FORMATS:
        for rows in (1, 2, 3, 7, 40):
            d, m, q, packed = random_codes(fmt, 64, 256, seed=rows)
            x, bias = _x(rows, 256), torch.randn(64)
            expected = reference(x, d, m, q, bias)
            out = narrow.q8a_coded_linear(x, packed, bias)
            if build in ("haswell", "skylake-avx512"):
                assert torch.equal(out, expected), (fmt, rows)
            else:
                torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
            gate_up = narrow.q8a_coded_linear(x, packed, narrow.swiglu_order(bias), swiglu=True)
            assert gate_up.shape == (rows, 32)


def test_packed_linears_take_int8_activations_when_told_int8(kernel):
    """With ``code_activations = "int8"`` a block-code linear runs q8a_coded_linear where VNNI or AVX2
    sums int8 codes, coded_linear by default (``"float"``); under a bf16 model (a packed weight handed
    over as it is) it takes and returns bf16."""
    import dataclasses

    from hetero_core.model.cpu.linear import PackedLinear
    from tests.model.kernel_weights import q4_1_weight

    weight, bias, x = q4_1_weight(64, 96), torch.randn(64), _x(5, 96)
    assert not PackedLinear(weight, bias, kernel).int8_activations  # the default: float
    kernel = dataclasses.replace(kernel, code_activations="int8")
    linear = PackedLinear(weight, bias, kernel)
    assert linear.kernel_dtype == "codes"
    assert linear.int8_activations == (kernel.q8a_path != "int32")
    if linear.int8_activations:
        assert torch.equal(linear(x), kernel.q8a_coded_linear(x, linear.kernel_weight, bias))
        packed = PackedLinear.from_kernel_layout(linear.kernel_weight, bias, kernel)
        out = packed(x.bfloat16())
        assert out.dtype == torch.bfloat16
        assert torch.equal(
            out, kernel.q8a_coded_linear(x.bfloat16(), linear.kernel_weight, bias, out_dtype=torch.bfloat16)
        )
    exact = PackedLinear(weight, bias, dataclasses.replace(kernel, code_activations="float"))
    assert not exact.int8_activations
    assert torch.equal(exact(x), kernel.f32_linear(x, kernel.pack_f32_linear(weight), bias))


def test_the_code_activations_option_is_checked():
    from pydantic import ValidationError

    from hetero_core.default_plugins.torch_options import TorchExecutorOptions

    assert TorchExecutorOptions().code_activations == "float"  # int8 is opt-in
    assert TorchExecutorOptions(code_activations="int8").code_activations == "int8"
    with pytest.raises(ValidationError, match="'int8' or 'float'"):
        TorchExecutorOptions(code_activations="int4")
