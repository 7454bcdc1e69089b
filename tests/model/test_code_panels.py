"""The compact block-code layouts (``code_panels``: fp16 scales per block, k-quant scales per super-block)
hold the same fp32 ``d`` and ``m`` as the fp32-scale layouts, so every code linear gives the same bits
from them, on every row count, with bias and SwiGLU, on the vector paths and the (emulated) AMX-INT8
tiles, from fewer bytes; ``pack_codes`` takes a compact layout only where it is exact."""

from __future__ import annotations

import pytest
import torch

from hetero_core.model.cpu.code_panels import (
    CODES_Q4,
    CODES_Q4_F16,
    CODES_Q4_SUPER,
    CODES_Q8,
    CODES_Q8_F16,
    CODES_Q8_SUB16,
    CODES_Q8_SUB16_SUPER,
    SuperScales,
    code_format,
    code_in_features,
    pack_codes,
)
from tests.model.kernel_builds import kernels_for

# layout -> (the fp32-scale layout holding the same codes, bytes per weight)
LAYOUTS = {
    CODES_Q4_F16: (CODES_Q4, 0.625),
    CODES_Q8_F16: (CODES_Q8, 1.0625),
    CODES_Q4_SUPER: (CODES_Q4, 0.59375),
    CODES_Q8_SUB16_SUPER: (CODES_Q8_SUB16, 1.078125),
}


def random_codes(layout: int, rows: int, inputs: int, seed: int = 0):
    """``(d, m, q, supers)`` of random codes whose scales ``layout`` holds exactly (k-quant-like: f16
    bases times integer factors; elsewhere f16 scales), the codes over their whole range."""
    g = torch.Generator().manual_seed(seed)
    four = layout in (CODES_Q4_F16, CODES_Q4_SUPER)
    block = 16 if layout == CODES_Q8_SUB16_SUPER else 32
    supers = None
    if layout in (CODES_Q4_SUPER, CODES_Q8_SUB16_SUPER):
        count, per = inputs // 256, 256 // block
        base = (torch.rand(rows, count, generator=g) * 2e-3 + 1e-5).half().float()
        if four:
            factors = torch.randint(0, 64, (rows, count, per), generator=g).to(torch.uint8)
            m_base = -(torch.rand(rows, count, generator=g) * 1e-2).half().float()
            m_factors = torch.randint(0, 64, (rows, count, per), generator=g).to(torch.uint8)
            supers = SuperScales(base, factors, m_base, m_factors)
        else:
            factors = torch.randint(-128, 128, (rows, count, per), generator=g).to(torch.int8)
            supers = SuperScales(base, factors)
        d, m = supers.expanded()
        m = torch.zeros_like(d) if m is None else m
    else:
        d = (torch.rand(rows, inputs // block, generator=g) * 0.02 + 1e-4).half().float()
        d[0, 0] = 2.0**-20  # an f16 subnormal
        m = torch.zeros_like(d)
        if four:
            m = (torch.rand(rows, inputs // block, generator=g) * -0.1).half().float()
    low, high = (0, 16) if four else (-128, 128)
    q = torch.randint(low, high, (rows, inputs // block, block), generator=g)
    return d, m, q.to(torch.uint8 if four else torch.int8), supers


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_compact_layout_is_chosen_where_exact_and_tells_its_shape(layout):
    d, m, q, supers = random_codes(layout, 48, 512)
    compact, plain = pack_codes(d, m, q, supers), pack_codes(d, m, q, supers, compact=False)
    fp32_layout, bytes_per_weight = LAYOUTS[layout]
    assert code_format(compact) == layout and code_format(plain) == fp32_layout
    assert code_in_features(compact) == code_in_features(plain) == 512
    assert compact.shape[0] == plain.shape[0] == 48 // 16
    assert compact.numel() == 48 * 512 * bytes_per_weight < plain.numel()


def test_scales_the_compact_layouts_cannot_hold_exactly_keep_fp32():
    d, m, q, supers = random_codes(CODES_Q4_SUPER, 16, 256)
    wrong = SuperScales(supers.d, supers.d_factors, supers.m, supers.m_factors.clone())
    wrong.m_factors[3, 0, 2] += 1  # the factors no longer give m
    assert code_format(pack_codes(d, m, q, wrong)) == CODES_Q4  # Q4_K's d * sc is rarely an f16 value
    d32 = d.clone()
    d32[5, 1] = 1.0 + 2.0**-20  # not an f16 value
    assert code_format(pack_codes(d32, m, q)) == CODES_Q4
    d8, _, q8, _ = random_codes(CODES_Q8_F16, 16, 64)
    assert code_format(pack_codes(d8, torch.full_like(d8, 0.5), q8)) == CODES_Q8  # offsets: no Q8_F16
    with pytest.raises(ValueError, match="multiple of 16"):
        pack_codes(d[:8], m[:8], q[:8])
    with pytest.raises(ValueError, match="not a packed block-code weight"):
        code_format(torch.zeros(1, 1, 100, dtype=torch.uint8))


@pytest.mark.parametrize("build", ["native", "haswell", "x86-64", "amx-emulated"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_code_linear_gives_the_same_bits_from_a_compact_layout(build, layout, tmp_path_factory):
    """coded_linear (fp32 activations) and q8a_coded_linear (int8; from 4 rows on the emulated tiles
    in ``amx-emulated``), fp32 and bf16 activations and outputs, bias and SwiGLU, 1-37 rows."""
    kernels = kernels_for(build, tmp_path_factory.mktemp("builds"))
    outputs, inputs = 64, 512
    d, m, q, supers = random_codes(layout, outputs, inputs, seed=layout)
    bias = torch.randn(outputs, generator=torch.Generator().manual_seed(1))
    for swiglu in (False, True):
        order = kernels.swiglu_order if swiglu else (lambda t: t)
        rows_d, rows_m, rows_q = order(d), order(m), order(q)
        rows_supers = None
        if supers is not None:
            parts = (supers.d, supers.d_factors, supers.m, supers.m_factors)
            rows_supers = SuperScales(*(None if t is None else order(t) for t in parts))
        compact = pack_codes(rows_d, rows_m, rows_q, rows_supers)
        plain = pack_codes(rows_d, rows_m, rows_q, rows_supers, compact=False)
        assert code_format(compact) == layout
        ordered_bias = order(bias)
        for rows in (1, 2, 3, 5, 16, 37):
            x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows))
            x[:, 32:64] = 0.0  # a block of zeros: its activation scale is 0
            expected = kernels.coded_linear(x, plain, ordered_bias, swiglu=swiglu)
            assert torch.isfinite(expected).all()
            assert torch.equal(kernels.coded_linear(x, compact, ordered_bias, swiglu=swiglu), expected)
            for dtype in (torch.float32, torch.bfloat16):
                x_in = x.to(dtype)
                got = kernels.q8a_coded_linear(x_in, compact, ordered_bias, swiglu=swiglu, out_dtype=dtype)
                want = kernels.q8a_coded_linear(x_in, plain, ordered_bias, swiglu=swiglu, out_dtype=dtype)
                assert torch.equal(got, want), (swiglu, rows, dtype)


def test_a_compact_weight_refuses_inputs_that_are_not_whole_super_blocks(cpu_kernels):
    d, m, q, supers = random_codes(CODES_Q4_SUPER, 16, 256)
    packed = pack_codes(d, m, q, supers)
    with pytest.raises(ValueError, match=r"\[rows, 256\]"):
        cpu_kernels.q8a_coded_linear(torch.zeros(2, 128), packed, None)
    assert cpu_kernels.coded_linear(torch.zeros(0, 256), packed, None).shape == (0, 16)
