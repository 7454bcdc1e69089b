"""A GGUF linear's parts (a plain linear, or the fused q/k/v and gate/up) as one packed module of
their codes: ``PackedLinear`` over one block-code layout, or ``SplitLinear`` where the parts' layouts
differ (``gguf_codes_loader`` calls ``coded_linear`` for each linear of the model).

- Parts whose codes have blocks of 32 inputs (Q4_0, Q4_1, Q4_K: 4-bit; Q5_0, Q5_1, Q5_K, Q8_0: 8-bit)
  are rows concatenated into one weight, a part with 8-bit codes widening the 4-bit ones to 8 bits
  (exact: 0..15 are int8 values); gate/up in the kernels' SwiGLU panel order.
- Q6_K's codes have blocks of 16 (``CODES_Q8_SUB16``). A fused linear of Q6_K parts only is one such
  weight; one that mixes them with the 32-input types is split into runs of consecutive parts of one
  block size (``split_linear`` says why no exact conversion exists), each packed as above: Q4_K_M's
  q, k (Q4_K) and v (Q6_K) become a q/k weight and a v weight.
- Each weight takes the most compact layout that holds its scales exactly (``code_panels.pack_codes``):
  the f16-scale types' scales in fp16, the k-quants' (Q4_K, Q6_K) per super-block as the file stores
  them (``super_block_scales``), the others per block in fp32.
- llama's q/k rows are un-permuted as codes (``reverse_permute``); a single unpermuted tensor is packed
  ``CHUNK_ROWS`` rows at a time (an LM head's codes alone are ~1 byte a weight before packing).

None where a part has no codes or a weight's rows do not fill the kernels' 16-row panels (32 for a
SwiGLU gate/up): the caller dequantizes that linear.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hetero_core.model.cpu.code_panels import PANEL, SuperScales, pack_codes
from hetero_core.model.cpu.linear import PackedLinear
from hetero_core.model.cpu.split_linear import SplitLinear
from hetero_core.model.gguf_checkpoint import reverse_permute
from hetero_core.model.gguf_codes import BlockCodes, codes_of, has_codes

CHUNK_ROWS = 4096  # rows of one tensor decoded at a time (a multiple of the kernels' 16-row panels)


def coded_linear(
    tensors: list, heads: list[int | None], bias: torch.Tensor | None, kernels, swiglu: bool
) -> nn.Module | None:
    """The packed module of GGUF ``tensors`` (the parts, in row order; ``heads``: each part's heads to
    un-permute over, or None) with ``bias`` (fp32, all the rows', or None); None as the module says."""
    if any(t.data.ndim != 2 or not has_codes(t.tensor_type.name) for t in tensors):
        return None
    if len(tensors) == 1 and not swiglu and heads[0] is None:
        packed = _packed_in_chunks(tensors[0], kernels)
        return None if packed is None else PackedLinear.from_kernel_layout(packed, bias, kernels)
    codes = [
        _unpermuted(codes_of(t.data, t.tensor_type.name), h) for t, h in zip(tensors, heads, strict=True)
    ]
    runs = _runs(codes)
    if len(runs) == 1:
        if runs[0].shape[0] % (2 * PANEL if swiglu else PANEL):
            return None
        return PackedLinear.from_kernel_layout(_packed(runs[0], kernels, swiglu), bias, kernels, swiglu)
    if any(run.shape[0] % PANEL for run in runs):
        return None
    ends = np.cumsum([run.shape[0] for run in runs])
    biases = [
        None if bias is None else bias[end - run.shape[0] : end] for run, end in zip(runs, ends, strict=True)
    ]
    return SplitLinear.from_kernel_layouts([_packed(run, kernels, False) for run in runs], biases, kernels)


def _runs(codes: list[BlockCodes]) -> list[BlockCodes]:
    """Consecutive parts of one block size merged (rows concatenated; mixed bits widened to 8)."""
    groups: list[list[BlockCodes]] = []
    for part in codes:
        if groups and groups[-1][0].block == part.block:
            groups[-1].append(part)
        else:
            groups.append([part])
    return [BlockCodes.concatenated(group) for group in groups]


def _packed(codes: BlockCodes, kernels, swiglu: bool) -> torch.Tensor:
    """``codes`` in the kernels' layout for them (rows in the SwiGLU order with ``swiglu``): the most
    compact that holds their scales exactly (``super_block_scales``)."""
    with_supers = codes.base is not None and super_block_scales(kernels)
    arrays = (codes.d, codes.m, codes.q) + ((codes.base, codes.factors) if with_supers else ())
    tensors = [_tensor(t) for t in arrays]  # the super-block scales only where they are packed
    if swiglu:
        tensors = [kernels.swiglu_order(t) for t in tensors]
    d, m, q = tensors[:3]
    supers = None
    if with_supers:
        base, factors = tensors[3:]
        with_m = base.shape[-1] == 2
        m_base, m_factors = (base[..., 1], factors[..., 1, :]) if with_m else (None, None)
        supers = SuperScales(base[..., 0], factors[..., 0, :], m_base, m_factors)
    return pack_codes(d, m, q, supers)


def super_block_scales(kernels) -> bool:
    """Whether k-quant codes (Q4_K, Q6_K) are packed with their scales per super-block
    (``CODES_Q4_SUPER``, ``CODES_Q8_SUB16_SUPER``: 0.59 and 1.08 bytes a weight) rather than per block
    in fp32 (0.75, 1.25): always, with the kernels. Each block's d and m are rebuilt from the
    super-block's base and the block's integer factor, widened with one ``vpmovzxbd``/``vpmovsxbd``;
    before that widening was written out (GCC had made it 8-16 scalar inserts a vector) the rebuild cost
    more than the bytes saved and Q4_K stayed per block. Measured after (docs/benchmarks.md; one row,
    weights streamed from memory, 2 threads, AVX2 EPYC): Q4_K's layout 1.14x the per-block one's rate
    with int8 activations and 1.05x with float ones, Q6_K's 1.29x and 1.01x."""
    return kernels is not None


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def _packed_in_chunks(tensor, kernels) -> torch.Tensor | None:
    """One tensor's codes packed ``CHUNK_ROWS`` rows at a time, or None where its rows do not fill
    the panels."""
    raw, type_name = tensor.data, tensor.tensor_type.name
    if raw.shape[0] % PANEL:
        return None
    out = None
    for start in range(0, raw.shape[0], CHUNK_ROWS):
        packed = _packed(codes_of(raw[start : start + CHUNK_ROWS], type_name), kernels, False)
        if out is None:
            out = torch.empty((raw.shape[0] // PANEL, *packed.shape[1:]), dtype=packed.dtype)
        out[start // PANEL : start // PANEL + packed.shape[0]] = packed
    return out


def _unpermuted(codes: BlockCodes, heads: int | None) -> BlockCodes:
    if heads is None:
        return codes
    return codes.rows_mapped(lambda t: reverse_permute(t, heads))
