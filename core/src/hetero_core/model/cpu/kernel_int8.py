"""The compiled kernels' int8 linears (``csrc/int8_linear.c``), as methods of ``kernels.CpuKernels``:
symmetric int8 weights with fp32 scales per output channel or per group of inputs, then
``x @ W.T + bias`` with the activations as they are (``int8_linear``, weight-only; with AVX-512 VNNI
and groups of at most 1,024 inputs they are summed as int16 per token and group, 2^-16 of the
group's largest value, finer than their own bf16 rounding) or quantized per
token (and group of inputs) to int8 (``w8a8_linear``, int32 sums through AVX-512 VNNI where the CPU
has it, plain int32 vector arithmetic elsewhere: the same sums, exactly).

Shapes by contract: any number of rows (none too), outputs in whole 16-column panels, inputs a
multiple of 4 and at most 65,536 (the int32 sums cannot overflow), groups a multiple of 4 dividing
the inputs. A weight that does not fit is not packed (``pack_int8_linear`` returns None); an input
that does not fit is a ValueError.
"""

from __future__ import annotations

import ctypes

import torch

from hetero_core.model.cpu.kernel_linears import PANEL, check_status, last_dim_contiguous, pointer

MAX_IN_FEATURES = 65536
INT8_MAX = 127
QUANTIZE_ROWS = 256  # output channels quantized at a time (``quantize_int8_weight``)


def group_size_for(in_features: int, group_size: int) -> int:
    """The group size a weight of ``in_features`` inputs gets: ``group_size`` where it is a multiple of 4
    dividing ``in_features``, else the whole row (one scale per output channel; also for 0)."""
    if group_size > 0 and group_size % 4 == 0 and in_features % group_size == 0:
        return group_size
    return in_features


def quantize_int8_weight(weight: torch.Tensor, group_size: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] -> (codes int8 [N, K], scale fp32 [N, K / g]) with g = ``group_size_for(K,
    group_size)``: symmetric, ``scale = max|w| / 127`` over each output channel's group, codes rounded
    to nearest (ties to even) in [-127, 127]; W ~ scale * codes. An all-zero group gets scale 0.
    Quantized ``QUANTIZE_ROWS`` output channels at a time (each row's codes depend on that row only),
    so the fp32 temporaries stay a few MB whatever the weight's size (loading 8B's MLP: 28,672 rows)."""
    out_features, in_features = weight.shape
    size = group_size_for(in_features, group_size)
    codes = torch.empty((out_features, in_features), dtype=torch.int8)
    scale = torch.empty((out_features, in_features // size), dtype=torch.float32)
    for start in range(0, out_features, QUANTIZE_ROWS):
        rows = weight.detach()[start : start + QUANTIZE_ROWS].float()
        grouped = rows.reshape(rows.shape[0], in_features // size, size)
        block_scale = grouped.abs().amax(dim=2) / INT8_MAX
        safe = torch.where(block_scale > 0, block_scale, torch.ones_like(block_scale))
        block = torch.round(grouped / safe[:, :, None]).clamp_(-INT8_MAX, INT8_MAX)
        codes[start : start + rows.shape[0]] = block.reshape(rows.shape[0], in_features)
        scale[start : start + rows.shape[0]] = block_scale
    return codes, scale


def quantize_int8_rows(x: torch.Tensor, group_size: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (codes int8 [M, K], scale fp32 [M, K / g]) per row (token) and group of g =
    ``group_size_for(K, group_size)`` inputs, as ``w8a8_linear`` quantizes them: ``q = round(x * (127 /
    max|x|))`` (ties to even) in [-127, 127], ``sx = max|x| / 127``."""
    x = x.float()
    rows, in_features = x.shape
    size = group_size_for(in_features, group_size)
    grouped = x.reshape(rows, in_features // size, size)
    absmax = grouped.abs().amax(dim=2)
    # 127 / max|x| as one fp32 division (a scalar over a tensor, torch multiplies by a reciprocal)
    inverse = torch.full_like(absmax, INT8_MAX).div(torch.where(absmax > 0, absmax, torch.ones_like(absmax)))
    inverse = torch.where(absmax > 0, inverse, torch.zeros_like(absmax))
    codes = torch.round(grouped * inverse[:, :, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes.reshape(rows, in_features), absmax / INT8_MAX


def group_sums(codes: torch.Tensor, groups: int) -> torch.Tensor:
    """The codes' sum over each group of each output channel, int32 [N, groups] (W8A8's correction)."""
    return codes.reshape(codes.shape[0], groups, -1).sum(dim=2, dtype=torch.int32)


class Int8Kernels:
    """Mixed into ``CpuKernels`` (which holds ``library``)."""

    library: ctypes.CDLL

    @property
    def w8a8_vnni(self) -> bool:
        """True where ``w8a8_linear`` sums with AVX-512 VNNI (elsewhere int32 vector arithmetic: the
        same sums, bit for bit)."""
        return bool(self.library.w8a8_linear_vnni())

    def pack_int8_linear(
        self, codes: torch.Tensor, scale: torch.Tensor, colsum: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...] | None:
        """``codes`` int8 [N, K], ``scale`` fp32 [N, groups] (and W8A8's ``colsum`` int32 [N, groups]) ->
        the layouts the int8 kernels read (codes [N / 16][K / 4][16][4], scales and sums [N / 16][groups]
        [16]), or None where they do not apply (N not a multiple of 16, K not a multiple of 4 or above
        65,536, groups not of a multiple of 4 inputs)."""
        out_features, in_features = codes.shape
        groups = scale.shape[1]
        if (
            codes.dtype != torch.int8
            or out_features % PANEL
            or in_features % 4
            or in_features > MAX_IN_FEATURES
            or in_features % groups
            or (in_features // groups) % 4
        ):
            return None
        packed = (
            codes.reshape(out_features // PANEL, PANEL, in_features // 4, 4).permute(0, 2, 1, 3).contiguous()
        )
        panel_order = [
            t.reshape(out_features // PANEL, PANEL, groups).transpose(1, 2).contiguous()
            for t in (scale.float(), colsum)
            if t is not None
        ]
        return (packed, *panel_order)

    def int8_linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``x @ (scale * codes).T + bias`` for ``x`` [M, K] fp32 or bf16, ``packed`` and ``scale`` from
        ``pack_int8_linear``, ``bias`` fp32 [N] or None -> [M, N] in ``out_dtype`` (fp32 or bf16)."""
        return self._run("int8_linear", x, packed, scale, None, bias, out_dtype)

    def w8a8_linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        scale: torch.Tensor,
        colsum: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """As ``int8_linear`` with each row of ``x`` quantized to int8 first, per group of the weight's
        (``quantize_int8_rows``), and the products summed exactly in int32; ``colsum`` from
        ``pack_int8_linear``."""
        if colsum.dtype != torch.int32 or colsum.shape != scale.shape or not colsum.is_contiguous():
            raise ValueError(f"w8a8_linear: colsum must be a contiguous int32 {tuple(scale.shape)}")
        return self._run("w8a8_linear", x, packed, scale, colsum, bias, out_dtype)

    def _run(self, kernel: str, x, packed, scale, colsum, bias, out_dtype) -> torch.Tensor:
        out_features, in_features = packed.shape[0] * PANEL, packed.shape[1] * 4
        if (
            x.dim() != 2
            or x.dtype not in (torch.float32, torch.bfloat16)
            or x.device.type != "cpu"
            or x.shape[1] != in_features
        ):
            raise ValueError(
                f"{kernel}: x must be a CPU float32 or bfloat16 tensor [rows, {in_features}], "
                f"got {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)} on {x.device}"
            )
        if out_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{kernel}: out_dtype must be float32 or bfloat16, got {out_dtype}")
        groups = scale.shape[1] if scale.dim() == 3 else 0
        if (
            scale.dtype != torch.float32
            or scale.dim() != 3
            or scale.shape[0] * PANEL != out_features
            or scale.shape[2] != PANEL
            or groups == 0
            or in_features % groups
            or not scale.is_contiguous()
        ):
            raise ValueError(
                f"{kernel}: scale must be a contiguous float32 [{out_features // PANEL}, groups, 16] "
                f"from pack_int8_linear, got {str(scale.dtype).removeprefix('torch.')} {tuple(scale.shape)}"
            )
        if bias is not None and (
            bias.dtype != torch.float32 or bias.shape != (out_features,) or not bias.is_contiguous()
        ):
            raise ValueError(f"{kernel}: bias must be a contiguous float32 [{out_features}]")
        x = last_dim_contiguous(x)
        if x.shape[0] > 1 and x.stride(0) < in_features:
            x = x.contiguous()
        ldx = x.stride(0) if x.shape[0] > 1 else in_features
        out = torch.empty((x.shape[0], out_features), dtype=out_dtype)
        args = [x.data_ptr(), ldx, int(x.dtype == torch.bfloat16), packed.data_ptr(), scale.data_ptr()]
        if colsum is not None:
            args.append(colsum.data_ptr())
        args += [
            pointer(bias),
            out.data_ptr(),
            out_features,
            x.shape[0],
            out_features,
            in_features,
            in_features // groups,
            int(out_dtype == torch.bfloat16),
            torch.get_num_threads(),
        ]
        status = getattr(self.library, kernel)(*args)
        check_status(
            status,
            kernel.replace("_", " "),
            f"{x.shape[0]} rows, {out_features} outputs, {in_features} inputs",
        )
        return out
