"""The compiled kernels' linear layers (``csrc/f32_linear.c``, ``csrc/bf16_linear.c``), as methods of
``cpu_kernels.CpuKernels``: a weight packed once into a kernel's layout, then ``x @ W.T + bias``.

Shapes by contract: any number of rows (none: an empty result of the right shape), any output
width in whole 16-column panels (pairs of panels for SwiGLU), any input width the layout takes
(bf16: even; block codes: whole blocks of 32). A weight that does not fit is not packed (``pack_*``
return None and the caller keeps torch); an input that does not fit its weight is a ValueError that
says which, and the C entry points check the same again (they return -1 and write nothing).

Every output of every kernel is one fixed-order chain over the inputs, whatever the rows, threads
and passes: a row's result never depends on its batch-mates (batch invariance).
"""

from __future__ import annotations

import ctypes

import torch

from hetero_core.model.cpu.block_codes import block_codes, may_be_block_codes
from hetero_core.model.cpu.code_panels import code_format, code_in_features, pack_codes

PANEL = 16  # output columns per panel of every layout
__all__ = ["LinearKernels", "code_format", "code_in_features"]
DTYPE_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the C symbols of each kernel's dtypes


class LinearKernels:
    """Mixed into ``CpuKernels`` (which holds ``library``, ``swiglu_pair_columns`` and ``block_codes``)."""

    library: ctypes.CDLL
    swiglu_pair_columns: int
    block_codes: bool
    code_activations: str
    code_tile_rows: int

    @property
    def int8_code_activations(self) -> bool:
        """True where block-code linears run ``q8a_coded_linear`` (``code_activations`` "int8" and the
        CPU sums int8 codes in vectors: AVX-512 VNNI or AVX2); else ``coded_linear``, exact fp32."""
        return self.code_activations == "int8" and self.q8a_path != "int32"

    @property
    def bf16_linear_native(self) -> bool:
        """True where the bf16 linear multiplies with AVX-512 BF16; elsewhere it widens the weight
        to fp32 in registers (the same results on every batch, other bits than the native ones)."""
        return bool(self.library.bf16_linear_native())

    def request_amx(self) -> bool:
        """Asks the kernel for the AMX tiles (``arch_prctl``); True when granted and this library's
        bf16 linear now runs on them (only the AMX variant's can: ``model/cpu/amx.py``)."""
        return self.library.amx_request_permission() == 0 and bool(self.library.bf16_linear_amx_granted())

    def fuses_swiglu(self, dtype: torch.dtype) -> bool:
        """True where the linear of ``dtype`` takes the MLP's SwiGLU activation inside it
        (``swiglu=True``): fp32 and its block codes (uint8, int8), and bf16."""
        return dtype in (torch.float32, torch.uint8, torch.int8, torch.bfloat16)

    def pack_bf16_linear(self, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor | None:
        """``weight`` [N, K] -> the layout ``bf16_linear`` reads ([N / 16][K / 2][16][2] bf16), or None
        where it does not apply (not bf16, N not a multiple of 16, K odd). ``swiglu``: ``weight`` is a
        fused gate/up projection (gate rows first), packed with its panels interleaved for
        ``bf16_linear(..., swiglu=True)`` (N a multiple of 32)."""
        out_features, in_features = weight.shape
        if (
            weight.dtype != torch.bfloat16
            or out_features % (2 * PANEL if swiglu else PANEL)
            or in_features % 2
        ):
            return None
        # each row's pairs of bf16 moved as one 32-bit word: a transpose of words, 3-5x faster than
        # torch's copy of 2-element rows (most of a bf16 model's packing time)
        if in_features == 0:
            return torch.empty((out_features // PANEL, 0, PANEL, 2), dtype=torch.bfloat16)
        pairs = weight.detach().contiguous().view(torch.int32)
        out = torch.empty((out_features // PANEL, in_features // 2, PANEL), dtype=torch.int32)
        if swiglu:  # panels in ``swiglu_order``: gate panel g, up panel g, gate panel g + 1, ...
            source = pairs.reshape(2, out_features // (2 * PANEL), PANEL, in_features // 2)
            pairs_of_panels = out.view(out_features // (2 * PANEL), 2, in_features // 2, PANEL)
            pairs_of_panels.copy_(source.permute(1, 0, 3, 2))
        else:
            out.copy_(pairs.reshape(out_features // PANEL, PANEL, in_features // 2).transpose(1, 2))
        return out.view(torch.bfloat16).reshape(out_features // PANEL, in_features // 2, PANEL, 2)

    def bf16_linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype = torch.bfloat16,
        swiglu: bool = False,
    ) -> torch.Tensor:
        """``x @ W.T + bias`` for ``x`` [M, K] bf16 (rows may be strided), ``packed`` from
        ``pack_bf16_linear``, ``bias`` fp32 [N] (in the packed column order: ``swiglu_panel_order``
        with ``swiglu``) or None -> a new [M, N] tensor in ``out_dtype`` (bfloat16, or float32: the
        fp32 sums, not rounded to bf16). ``swiglu``: ``silu(gate) * up`` instead, [M, N / 2] bf16."""
        out_features, in_features = packed.shape[0] * PANEL, packed.shape[1] * 2
        x, ldx = _input("bf16_linear", x, torch.bfloat16, in_features)
        _check_bias("bf16_linear", bias, out_features)
        width = out_features // 2 if swiglu else out_features
        out = torch.empty((x.shape[0], width), dtype=torch.bfloat16 if swiglu else out_dtype)
        status = self.library.bf16_linear(
            x.data_ptr(),
            ldx,
            packed.data_ptr(),
            pointer(bias),
            out.data_ptr(),
            width,
            x.shape[0],
            out_features,
            in_features,
            int(out.dtype == torch.float32),
            int(swiglu),
            torch.get_num_threads(),
        )
        check_status(
            status, "bf16 linear", f"{x.shape[0]} rows, {out_features} outputs, {in_features} inputs"
        )
        return out

    def pack_f32_linear(self, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor | None:
        """``weight`` [N, K] fp32 -> the layout ``f32_linear`` reads ([N / 16][K][16]), or None where it
        does not apply (not fp32, N not a multiple of 16, of 32 with ``swiglu``; as for
        ``pack_bf16_linear``)."""
        out_features, in_features = weight.shape
        if weight.dtype != torch.float32 or out_features % (2 * PANEL if swiglu else PANEL):
            return None
        if swiglu:
            return swiglu_panels(weight.detach(), self.swiglu_pair_columns)
        return (
            weight.detach().reshape(out_features // PANEL, PANEL, in_features).permute(0, 2, 1).contiguous()
        )

    def f32_linear(
        self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, swiglu: bool = False
    ) -> torch.Tensor:
        """``x @ W.T + bias`` for ``x`` [M, K] fp32 (rows may be strided), ``packed`` from
        ``pack_f32_linear``, ``bias`` fp32 [N] or None (as for ``bf16_linear``) -> a new [M, N] fp32
        tensor; ``swiglu``: ``silu(gate) * up`` instead, [M, N / 2]."""
        out_features, in_features = packed.shape[0] * PANEL, packed.shape[1]
        x, ldx = _input("f32_linear", x, torch.float32, in_features)
        _check_bias("f32_linear", bias, out_features)
        width = out_features // 2 if swiglu else out_features
        out = torch.empty((x.shape[0], width), dtype=torch.float32)
        status = self.library.f32_linear(
            x.data_ptr(),
            ldx,
            packed.data_ptr(),
            pointer(bias),
            out.data_ptr(),
            width,
            x.shape[0],
            out_features,
            in_features,
            int(swiglu),
            torch.get_num_threads(),
        )
        check_status(
            status, "fp32 linear", f"{x.shape[0]} rows, {out_features} outputs, {in_features} inputs"
        )
        return out

    def pack_coded_linear(self, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor | None:
        """``weight`` [N, K] fp32 whose values are exact block codes (``block_codes``: Q4_1, Q8_0) ->
        the layout ``coded_linear`` reads (``code_panels.pack_codes``: the f16 scales in fp16, 0.625 or
        1.06 bytes a weight); None for any other weight, N not a multiple of 16 (32 with ``swiglu``:
        packed as for ``pack_f32_linear``), or with ``block_codes`` off."""
        if (
            not self.block_codes
            or weight.dtype != torch.float32
            or weight.shape[0] % (2 * PANEL if swiglu else PANEL)
        ):
            return None
        if swiglu and not may_be_block_codes(weight):  # refused before a reordered copy is made
            return None
        found = block_codes(self.swiglu_order(weight.detach()) if swiglu else weight)
        if found is None:
            return None
        d, m, q, _ = found
        return pack_codes(d, m, q)

    def coded_linear(
        self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, swiglu: bool = False
    ) -> torch.Tensor:
        """``f32_linear`` with ``packed`` from ``pack_coded_linear``: the same result, bit for bit, as
        ``f32_linear`` on the fp32 weight it was packed from."""
        out_features, in_features = packed.shape[0] * PANEL, code_in_features(packed)
        x, ldx = _input("coded_linear", x, torch.float32, in_features)
        _check_bias("coded_linear", bias, out_features)
        width = out_features // 2 if swiglu else out_features
        out = torch.empty((x.shape[0], width), dtype=torch.float32)
        status = self.library.coded_linear(
            x.data_ptr(),
            ldx,
            packed.data_ptr(),
            pointer(bias),
            out.data_ptr(),
            width,
            x.shape[0],
            out_features,
            in_features,
            code_format(packed),
            int(swiglu),
            torch.get_num_threads(),
        )
        check_status(
            status, "coded linear", f"{x.shape[0]} rows, {out_features} outputs, {in_features} inputs"
        )
        return out

    @property
    def q8a_path(self) -> str:
        """How ``q8a_coded_linear`` sums the codes here: ``"vnni"`` (AVX-512 VNNI), ``"avx2"``
        (VPMADDUBSW) or ``"int32"`` (plain vector arithmetic: correct, not fast)."""
        return ("int32", "avx2", "vnni")[self.library.q8a_coded_linear_path()]

    @property
    def code_linear_path(self) -> str:
        """How block-code linears run here, in words (the ``executor.code_linears`` log line)."""
        if not self.int8_code_activations:
            return "coded_linear: fp32 activations"
        if self.code_tile_rows:
            return f"q8a_coded_linear: amx-int8 tiles from {self.code_tile_rows} rows, {self.q8a_path} below"
        return f"q8a_coded_linear: {self.q8a_path}"

    def q8a_coded_linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        bias: torch.Tensor | None,
        swiglu: bool = False,
        out_dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """``coded_linear`` with the activations quantized to int8 per row and block of 32 inputs
        (``quantize_q8_blocks``) and integer dot products on the codes: ``x`` [M, K] fp32 or bf16,
        ``packed`` from ``pack_coded_linear`` / ``pack_code_panels*`` -> [M, N] (or [M, N / 2] with
        ``swiglu``) in ``out_dtype`` (fp32 or bf16). Batch-invariant; not coded_linear's bits: the
        activations lose 2^-8 of each block's largest value. Calls of ``code_tile_rows`` rows or more sum
        on AMX-INT8 tiles where enabled (``amx_int8``): the same bits."""
        out_features, in_features = packed.shape[0] * PANEL, code_in_features(packed)
        if x.dtype not in DTYPE_SUFFIXES or out_dtype not in DTYPE_SUFFIXES:
            raise ValueError(
                f"q8a_coded_linear: x and the output must be float32 or bfloat16, got {x.dtype}, {out_dtype}"
            )
        x, ldx = _input("q8a_coded_linear", x, x.dtype, in_features)
        if in_features % 32:
            raise ValueError(f"q8a_coded_linear: inputs must be whole blocks of 32, got {in_features}")
        _check_bias("q8a_coded_linear", bias, out_features)
        width = out_features // 2 if swiglu else out_features
        out = torch.empty((x.shape[0], width), dtype=out_dtype)
        status = self.library.q8a_coded_linear(
            x.data_ptr(),
            ldx,
            int(x.dtype == torch.bfloat16),
            packed.data_ptr(),
            pointer(bias),
            out.data_ptr(),
            width,
            x.shape[0],
            out_features,
            in_features,
            code_format(packed),
            int(swiglu),
            int(out_dtype == torch.bfloat16),
            self.code_tile_rows,
            torch.get_num_threads(),
        )
        check_status(
            status,
            "int8-activation coded linear",
            f"{x.shape[0]} rows, {out_features} outputs, {in_features} inputs",
        )
        return out

    def swiglu_order(self, gate_up: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``gate_up``'s rows (or bias) in the order the linear of ``dtype`` takes for ``swiglu``."""
        return swiglu_panel_order(gate_up, PANEL if dtype == torch.bfloat16 else self.swiglu_pair_columns)


def swiglu_panel_order(gate_up: torch.Tensor, columns: int) -> torch.Tensor:
    """A fused gate/up projection's rows (or bias), gate first, reordered to the kernels' SwiGLU order:
    ``columns`` gate rows, the ``columns`` up rows of the same outputs, the next gate rows, ..."""
    size = gate_up.shape[0] // 2
    halves = gate_up.reshape(2, size // columns, columns, *gate_up.shape[1:])
    return halves.transpose(0, 1).reshape(gate_up.shape)


def swiglu_panels(gate_up: torch.Tensor, columns: int) -> torch.Tensor:
    """``swiglu_panel_order(gate_up, columns)`` packed in panels of ``PANEL`` rows ([N / 16][K][16], as
    ``pack_f32_linear`` lays out any weight) in one copy, not a reordered copy and then the panels."""
    rows, inputs = gate_up.shape
    half = rows // 2
    out = torch.empty((rows // PANEL, inputs, PANEL), dtype=gate_up.dtype)
    if PANEL % (2 * columns) == 0:  # each panel holds PANEL / (2 * columns) gate/up pairs of columns
        pairs = PANEL // (2 * columns)
        source = gate_up.reshape(2, rows // PANEL, pairs, columns, inputs).permute(1, 4, 2, 0, 3)
        out.view(rows // PANEL, inputs, pairs, 2, columns).copy_(source)
    elif columns % PANEL == 0:  # each half-pair of columns fills columns / PANEL panels
        per_half = columns // PANEL
        source = gate_up.reshape(2, half // columns, per_half, PANEL, inputs).permute(1, 0, 2, 4, 3)
        out.view(half // columns, 2, per_half, inputs, PANEL).copy_(source)
    else:
        out.copy_(swiglu_panel_order(gate_up, columns).reshape(rows // PANEL, PANEL, inputs).permute(0, 2, 1))
    return out


def check_status(status: int, kernel: str, shapes: str) -> None:
    """A kernel's return value: 0 done; -1 it refused its inputs (ValueError); -2 (or any other) it
    could not allocate its buffers (MemoryError)."""
    if status == 0:
        return
    if status == -1:
        raise ValueError(f"the CPU {kernel} kernel refused its inputs ({shapes})")
    raise MemoryError(f"the CPU {kernel} kernel could not allocate its buffers ({shapes})")


def pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def last_dim_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _input(kernel: str, x: torch.Tensor, dtype: torch.dtype, in_features: int) -> tuple[torch.Tensor, int]:
    """``(x, row stride)`` as the kernel reads them ([M, K] of ``dtype``, unit stride along K, rows at
    least K apart), or a ValueError naming what does not fit."""
    if x.dim() != 2 or x.dtype != dtype or x.device.type != "cpu" or x.shape[1] != in_features:
        raise ValueError(
            f"{kernel}: x must be a CPU {str(dtype).removeprefix('torch.')} tensor [rows, "
            f"{in_features}], got {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)} on {x.device}"
        )
    x = last_dim_contiguous(x)
    if x.shape[0] < 2:
        return x, in_features  # one row or none: its stride is never used
    return (x, x.stride(0)) if x.stride(0) >= in_features else (x.contiguous(), in_features)


def _check_bias(kernel: str, bias: torch.Tensor | None, out_features: int) -> None:
    if bias is not None and (
        bias.dtype != torch.float32 or bias.shape != (out_features,) or not bias.is_contiguous()
    ):
        raise ValueError(
            f"{kernel}: bias must be a contiguous float32 [{out_features}], got "
            f"{str(bias.dtype).removeprefix('torch.')} {tuple(bias.shape)}"
        )
