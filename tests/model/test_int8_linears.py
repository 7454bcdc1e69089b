"""The int8 linears (``csrc/int8_linear.c``, ``model/cpu/int8_linear.py``) by contract, in this CPU's
build and the narrow ones (SSE without FMA, AVX2, AVX-512 without VNNI): float64 references within
bounds derived from the int8 rounding (and weight-only's int16 activations where AVX-512 VNNI sums
them), W8A8's integer sums equal on every build, a row's result the same alone or batched and on any
threads, torch's operators (no compiler) within the same bounds, and clear refusals."""

from __future__ import annotations

import pytest
import torch

from hetero_core.model.cpu.int8_linear import Int8Linear, linear_weight_bytes, quantize_linears
from hetero_core.model.cpu.kernel_int8 import group_size_for, quantize_int8_rows, quantize_int8_weight
from tests.model.kernel_builds import kernels_for

BUILDS = ("native", "x86-64", "haswell", "skylake-avx512")
ROWS = (0, 1, 7, 13)
SHAPES = [(16, 4), (48, 64), (96, 96)]  # (out, in): one panel; three (a whole group of panels); two groups


@pytest.fixture(params=BUILDS)
def kernels(request, tmp_path_factory):
    return kernels_for(request.param, tmp_path_factory.getbasetemp() / "kernel_builds")


def _data(rows: int, out_features: int, in_features: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    x = torch.randn(rows, in_features, generator=generator) * 3
    return weight, bias, x


def _dequantized(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    codes, scale = quantize_int8_weight(weight, group_size)
    groups = scale.shape[1]
    return (codes.double().reshape(codes.shape[0], groups, -1) * scale.double()[:, :, None]).reshape(
        codes.shape
    )


def _check(y: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, out_dtype: torch.dtype) -> None:
    """``y`` within ``bound`` (the arithmetic's own error) of ``expected``, plus bf16's output rounding."""
    rounding = expected.abs() * (2.0**-8) if out_dtype == torch.bfloat16 else 0
    assert y.shape == expected.shape and y.dtype == out_dtype
    assert bool(((y.double() - expected).abs() <= bound + rounding + 1e-9).all())


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("group_size", [0, 32])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_weight_only_int8_is_x_times_the_dequantized_weight(kernels, rows, group_size, x_dtype):
    for out_features, in_features in SHAPES:
        weight, bias, x = _data(rows, out_features, in_features, seed=rows + in_features)
        x = x.to(x_dtype)
        linear = Int8Linear(weight, bias, kernels, "float", group_size)
        assert linear.kernels is kernels
        for float32_output in (True, False):
            linear.float32_output = float32_output
            out_dtype = torch.float32 if float32_output else x_dtype
            y = linear(x)
            xd = x.double()
            deq = _dequantized(weight, group_size)
            expected = xd @ deq.T + bias.double()
            # fp32 sums of K terms: each rounding at most 2^-24 of the running magnitude; and, where the
            # build sums int16 activations (AVX-512 VNNI), half a step of 1/32767 of each group's max |x|
            bound = 4 * in_features * 2.0**-24 * (xd.abs() @ deq.abs().T + bias.double().abs())
            size = group_size_for(in_features, group_size)
            x16_step = (
                xd.abs().reshape(rows, in_features // size, size).amax(dim=2).repeat_interleave(size, dim=1)
                / 32767
                / 2
            )
            bound = bound + x16_step @ deq.abs().T
            _check(y, expected, bound, out_dtype)
            # and within the int8 rounding of the weights (half a step per weight) of the unquantized linear
            step = (deq - weight.double()).abs().max()
            assert step <= weight.abs().max() / 254 + 1e-7
            exact = xd @ weight.double().T + bias.double()
            _check(y, exact, bound + xd.abs().sum(dim=1, keepdim=True) * step, out_dtype)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("group_size", [0, 32])
def test_w8a8_sums_the_quantized_activations_exactly(kernels, rows, group_size):
    for out_features, in_features in SHAPES:
        weight, bias, x = _data(rows, out_features, in_features, seed=7 * rows + in_features)
        linear = Int8Linear(weight, bias, kernels, "int8", group_size)
        linear.float32_output = True
        y = linear(x)
        codes, scale = quantize_int8_weight(weight, group_size)
        x_codes, x_scale = quantize_int8_rows(x, group_size)
        groups, size = scale.shape[1], in_features // scale.shape[1]
        expected = bias.double().expand(rows, out_features).clone()
        bound = torch.zeros(rows, out_features, dtype=torch.float64)
        for g in range(groups):
            part = slice(g * size, (g + 1) * size)
            sums = x_codes[:, part].double() @ codes[:, part].double().T  # exact integers
            term = sums * (x_scale[:, g].double()[:, None] * scale[:, g].double())
            expected += term
            bound += 4 * 2.0**-24 * (term.abs() + expected.abs())  # the scaling and the sum over groups
        _check(y, expected, bound, torch.float32)
        # within int8 rounding of the exact linear: half a step of each weight and each activation
        deq = _dequantized(weight, group_size)
        x_step = (x_scale.repeat_interleave(size, dim=1) / 2).double()
        w_step = (deq - weight.double()).abs()
        slack = x.double().abs() @ w_step.T + x_step @ deq.abs().T + x_step @ w_step.T
        _check(y, x.double() @ weight.double().T + bias.double(), bound + slack, torch.float32)


def test_w8a8_gives_the_same_bits_on_every_build_with_fused_multiply_adds(tmp_path_factory):
    weight, bias, x = _data(9, 48, 96, seed=3)
    results = []
    for build in (
        "native",
        "haswell",
        "skylake-avx512",
    ):  # VNNI (where this CPU has it), AVX2, AVX-512 without
        try:
            kernels = kernels_for(build, tmp_path_factory.getbasetemp() / "kernel_builds")
        except pytest.skip.Exception:
            continue
        linear = Int8Linear(weight, bias, kernels, "int8", 32)
        linear.float32_output = True
        results.append(linear(x))
    for other in results[1:]:
        assert torch.equal(other, results[0])


@pytest.mark.parametrize("activations", ["float", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_bits_alone_batched_and_on_any_threads(kernels, activations, dtype):
    weight, bias, x = _data(21, 96, 96, seed=11)
    x = x.to(dtype)
    linear = Int8Linear(weight, bias, kernels, activations, 32)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [linear(x[i : i + 1]) for i in range(x.shape[0])]
        torch.set_num_threads(2)
        batched = linear(x)
    finally:
        torch.set_num_threads(saved)
    for i, row in enumerate(alone):
        assert torch.equal(row[0], batched[i]), f"row {i}"
    for n in (2, 8, 13):
        assert torch.equal(linear(x[:n]), batched[:n])


@pytest.mark.parametrize("activations", ["float", "int8"])
def test_torchs_operators_stand_in_without_the_kernels(kernels, activations):
    weight, bias, x = _data(5, 48, 64, seed=5)
    for group_size in (0, 32):
        compiled = Int8Linear(weight, bias, kernels, activations, group_size)
        plain = Int8Linear(weight, bias, None, activations, group_size)
        assert plain.kernels is None
        compiled.float32_output = plain.float32_output = True
        expected = compiled(x).double()
        assert torch.allclose(plain(x).double(), expected, rtol=1e-5, atol=1e-4 * float(expected.abs().max()))


def test_shapes_the_layout_cannot_take_are_not_packed_and_bad_inputs_are_refused(kernels):
    codes, scale = quantize_int8_weight(torch.randn(24, 64))
    assert kernels.pack_int8_linear(codes, scale) is None  # 24 outputs: not whole panels
    codes, scale = quantize_int8_weight(torch.randn(16, 6))
    assert kernels.pack_int8_linear(codes, scale) is None  # 6 inputs: not whole quads
    linear = Int8Linear(torch.randn(16, 6), None, kernels)
    assert linear.kernels is None and linear(torch.randn(2, 6)).shape == (2, 16)  # torch's operator instead
    linear = Int8Linear(torch.randn(32, 64), None, kernels, "int8", 32)
    with pytest.raises(ValueError, match="x must be"):
        kernels.w8a8_linear(
            torch.randn(3, 60), linear.codes, linear.scale, linear.colsum, None, torch.float32
        )
    with pytest.raises(ValueError, match="x must be"):
        kernels.int8_linear(torch.randn(3, 64).half(), linear.codes, linear.scale, None, torch.float32)
    with pytest.raises(ValueError, match="colsum"):
        kernels.w8a8_linear(
            torch.randn(3, 64), linear.codes, linear.scale, linear.colsum.float(), None, torch.float32
        )
    assert linear(torch.randn(0, 64)).shape == (0, 32)


def test_quantization_helpers():
    assert group_size_for(96, 32) == 32 and group_size_for(96, 64) == 96 and group_size_for(96, 0) == 96
    codes, scale = quantize_int8_weight(torch.zeros(16, 8))
    assert not codes.any() and not scale.any()  # an all-zero row: scale 0, codes 0
    codes, scale = quantize_int8_rows(torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, -2.0, 0.5, 2.0]]))
    assert codes[0].tolist() == [0, 0, 0, 0] and codes[1].tolist() == [64, -127, 32, 127]  # 63.5 -> 64 (even)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 16))
    before = linear_weight_bytes(model)
    assert quantize_linears(model, "int8", skip=("1",)) == 1
    assert isinstance(model[0], Int8Linear) and isinstance(model[1], torch.nn.Linear)
    assert linear_weight_bytes(model) < before
    with pytest.raises(ValueError, match="choices: int8, w8a8"):
        quantize_linears(model, "int4")


def test_a_weight_larger_than_one_chunk_is_quantized_as_its_rows_are():
    """``quantize_int8_weight`` works ``QUANTIZE_ROWS`` channels at a time (bounded temporaries while a
    large model loads): each row's codes and scales are the ones that row alone gets."""
    from hetero_core.model.cpu.kernel_int8 import QUANTIZE_ROWS

    weight = torch.randn(2 * QUANTIZE_ROWS + 37, 64, generator=torch.Generator().manual_seed(3))
    weight[5] = 0  # an all-zero row among them
    codes, scale = quantize_int8_weight(weight.bfloat16(), 32)
    assert codes.shape == (weight.shape[0], 64) and scale.shape == (weight.shape[0], 2)
    for row in (0, 5, QUANTIZE_ROWS - 1, QUANTIZE_ROWS, weight.shape[0] - 1):
        alone_codes, alone_scale = quantize_int8_weight(weight[row : row + 1].bfloat16(), 32)
        assert torch.equal(codes[row], alone_codes[0]) and torch.equal(scale[row], alone_scale[0])
    dequantized = (codes.float().reshape(-1, 2, 32) * scale[:, :, None]).reshape(weight.shape)
    assert (dequantized - weight.bfloat16().float()).abs().max() <= scale.max() / 2 + 1e-6
