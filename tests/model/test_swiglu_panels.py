"""The fp32 linear's fused gate/up weight packed in one copy (``swiglu_panels``), and the block-code
check that refuses a weight before its rows are reordered (``may_be_block_codes``)."""

from __future__ import annotations

import pytest
import torch

from hetero_core.model.cpu.block_codes import block_codes, may_be_block_codes
from hetero_core.model.cpu.kernel_linears import PANEL, swiglu_panel_order, swiglu_panels


@pytest.mark.parametrize("columns", [4, 8, 16, 32, 48])  # pairs per panel, one panel a half, several
def test_swiglu_panels_is_the_reordered_weight_in_panels(columns):
    rows = 2 * 48 * 4
    weight = torch.randn(rows, 64)
    expected = swiglu_panel_order(weight, columns).reshape(rows // PANEL, PANEL, 64).permute(0, 2, 1)
    packed = swiglu_panels(weight, columns)
    assert packed.is_contiguous()
    assert torch.equal(packed, expected)


def _q8_codes(rows: int) -> torch.Tensor:
    scales = torch.rand(rows, 2).half().float()
    codes = torch.randint(-127, 128, (rows, 2, 32)).float()
    codes[..., 0] = 127  # the block's largest code: d = max |w| / 127
    return (scales[..., None] * codes).reshape(rows, 64)


def test_may_be_block_codes_follows_the_first_rows():
    weight = _q8_codes(256)
    assert may_be_block_codes(weight) and block_codes(weight) is not None
    assert not may_be_block_codes(torch.randn(256, 64))
    weight[200, 5] += 1e-3  # a later row that is not codes: the check passes, the whole weight is refused
    assert may_be_block_codes(weight) and block_codes(weight) is None
    weight[3, 5] += 1e-3  # one of the first rows
    assert not may_be_block_codes(weight)
    assert not may_be_block_codes(weight.to(torch.bfloat16))
