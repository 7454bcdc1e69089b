"""The compiled CPU attention kernels: built once with the system C compiler, called via ctypes.

Torch has no paged attention for the CPU: the pure-torch path gathers every sequence's KV blocks
into a padded copy for decodes, runs one SDPA call per prefilling sequence (~0.2 ms of overhead
each, 30 layers x 32 prompts per step), and writes new K/V with ``index_copy_`` from strided rows
(~1.5 ms per layer for a 2,400-token prefill in bf16). The C sources in ``csrc/`` do all three
straight on the block-table cache, vectorised for this CPU (``-march=native``):

- ``paged_kv_write.c``: the step's new K/V rows into their slots;
- ``paged_decode_attention.c``: single-token queries, K and V each read once;
- ``paged_prefill_attention.c``: every multi-token query of a step in one call (causal, any cached
  prefix), flash-attention style in fp32;
- ``pointwise.c``: the model's element-wise steps (residual add + RMSNorm, SiLU-and-multiply, RoPE
  in place), one pass each instead of 5-7 eager torch ops;
- ``bf16_linear.c``: bf16 linears (AVX-512 BF16 dot products over a weight packed once at load),
  overlapping the weight stream with compute better than oneDNN at decode sizes;
- ``f32_linear.c``: fp32 linears the same way, with fused multiply-adds of any vector width (the
  default dtype of CPUs without bf16 arithmetic, AVX2-only ones); and ``coded_linear``, the same
  over weights that are exact block codes (a Q4_1 or Q8_0 GGUF's), expanded as they stream in:
  bit-identical results from 0.75 or 1.25 instead of 4 bytes per weight (``block_codes``);
- ``decode_layers.c``: every decoder layer of a pure decode step in one call, the kernels above in
  the model code's order (``fused_decode``).

They have no Python or torch headers and need GCC (its vector extensions; ``$CC`` or ``cc``), so
they compile in about two seconds; the shared library is cached under ``~/.cache/hetero/kernels``
(``HETERO_CACHE_DIR``), keyed by the sources, the compiler and this CPU's flags, with a checksum
footer (``cache_file``) checked before it is loaded: a damaged library is rebuilt, never mapped.

Where no C compiler works the torch path runs instead (``load_cpu_kernels`` returns None and says
why, once). The executor option ``cpu_kernels`` chooses: ``auto`` (the kernels when they build),
``compiled`` (required: an error if they cannot build), ``torch`` (never).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from hetero_core.logging import get_logger
from hetero_core.model import cache_file
from hetero_core.model.compute_dtype import cpu_flags
from hetero_core.model.gguf_cache import default_cache_dir

log = get_logger("hetero.executor")

SOURCE_DIR = Path(__file__).with_name("csrc")
SOURCES = ("paged_kv_write.c", "paged_decode_attention.c", "paged_prefill_attention.c", "pointwise.c",
           "bf16_linear.c", "f32_linear.c", "decode_layers.c")
HEADERS = ("kernel_math.h",)
COMPILER_ENV = "CC"
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
          "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC")
MAX_HEAD_DIM, MAX_GROUP = 512, 64  # the kernels' fixed limits (paged_decode_attention.c)
LANES = 16  # widths the kernels take are multiples of this (of every ISA's LANES in kernel_math.h)
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "paged_kv_write": [_PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, ctypes.c_int],
    "paged_decode_attention": [_PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _I64, _I64,
                               _I64, _I64, _I64, _I64, ctypes.c_float, ctypes.c_int],
    "paged_prefill_attention": [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64,
                                _I64, _I64, _I64, ctypes.c_float, ctypes.c_int],
    "rms_norm": [_PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, ctypes.c_float, ctypes.c_int],
    "silu_mul": [_PTR, _I64, _PTR, _I64, _I64, _I64, ctypes.c_int],
    "rotary": [_PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, ctypes.c_int],
    "bf16_linear": [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int, ctypes.c_int],
    "bf16_linear_available": [],
    "swiglu_pair_columns": [],
    "decode_layers": [_PTR, _PTR],
    "f32_linear": [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int],
    "coded_linear": [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int, ctypes.c_int],
}
_UNTYPED = ("paged_kv_write", "bf16_linear", "bf16_linear_available", "swiglu_pair_columns", "f32_linear",
            "coded_linear", "decode_layers")  # one symbol for every dtype
_VOID = ("rms_norm", "silu_mul", "rotary")
DECODE_ATTENTION_REFUSED = ("the CPU decode-attention kernel refused its inputs (a context beyond its block "
                            "table, a slot outside the cache) or could not allocate its buffers")


class KernelUnavailable(Exception):
    """The kernels cannot be built or loaded here; the message says why."""


@dataclass(frozen=True)
class PrefillSequences:
    """The multi-token queries of a step, as the prefill kernel reads them (int64 tensors)."""

    query_start: torch.Tensor  # [num_seqs] each sequence's first row in the flat batch
    query_len: torch.Tensor  # [num_seqs] its rows (new tokens)
    context_lens: torch.Tensor  # [num_seqs] its tokens in the cache after this step's write
    block_tables: torch.Tensor  # [num_seqs, max_blocks] padded


@dataclass(frozen=True)
class CpuKernels:
    library: ctypes.CDLL
    path: Path
    # How the fp32 linear wants a fused gate/up weight's rows interleaved for SwiGLU (swiglu_panel_order):
    # 16 with 16-lane vectors (AVX-512), 8 with narrower ones (a pair in one 16-column panel).
    swiglu_pair_columns: int = 16
    block_codes: bool = True  # pack_coded_linear looks for block-code weights (False: it never does)

    def supports(self, query: torch.Tensor, num_kv_heads: int) -> bool:
        """True for a CPU query of a dtype, head size and group size the kernels handle."""
        num_heads, head_dim = query.shape[1:]
        return (query.device.type == "cpu" and query.dtype in _SUFFIX and head_dim <= MAX_HEAD_DIM
                and head_dim % LANES == 0 and num_heads % num_kv_heads == 0
                and num_heads // num_kv_heads <= MAX_GROUP)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slots: torch.Tensor) -> None:
        """``key``/``value`` [num_tokens, num_kv_heads, head_dim] (rows may be strided, heads and dims
        contiguous) into caches [num_kv_heads, num_blocks, block_size, head_dim] at ``slots`` [num_tokens]
        int64 (``block * block_size + offset``)."""
        num_tokens, num_kv_heads, head_dim = key.shape
        key, value = _rows_strided(key), _rows_strided(value)
        slots_per_head = key_cache.shape[1] * key_cache.shape[2]
        status = self.library.paged_kv_write(
            key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), key_cache.data_ptr(),
            value_cache.data_ptr(), slots.data_ptr(), num_tokens, num_kv_heads, head_dim, slots_per_head,
            key.element_size(), torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError(f"a KV slot lies outside the cache's {slots_per_head} slots per head")

    def attend_decode(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                      new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``query`` [num_seqs, num_heads, head_dim] (rows may be strided, heads and dims contiguous),
        caches [num_kv_heads, num_blocks, block_size, head_dim] contiguous, ``block_tables``
        [num_seqs, max_blocks] int64 (padded), ``context_lens`` [num_seqs] int64 -> a new
        [num_seqs, num_heads, head_dim] tensor. ``new_kv``: ``(key, value, slots)``, the step's own
        K/V rows [num_seqs, num_kv_heads, head_dim] to write at ``slots`` first (in the same call)."""
        num_seqs, num_heads, head_dim = query.shape
        num_kv_heads, num_blocks, block_size, _ = key_cache.shape
        query = _rows_strided(query)
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=query.dtype)
        new_key = new_value = slots = None
        if new_kv is not None:
            new_key, new_value, slots = _rows_strided(new_kv[0]), _rows_strided(new_kv[1]), new_kv[2]
            if new_key.stride(0) != new_value.stride(0):  # the kernel takes one token stride for both
                new_key, new_value = new_key.contiguous(), new_value.contiguous()
        status = getattr(self.library, "paged_decode_attention_" + _SUFFIX[query.dtype])(
            query.data_ptr(), query.stride(0), _pointer(new_key), _pointer(new_value),
            0 if new_key is None else new_key.stride(0), _pointer(slots), key_cache.data_ptr(),
            value_cache.data_ptr(), block_tables.data_ptr(), block_tables.shape[1], context_lens.data_ptr(),
            out.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size, scale,
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError(DECODE_ATTENTION_REFUSED)
        return out

    def attend_prefill(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       seqs: PrefillSequences, scale: float, out: torch.Tensor) -> None:
        """Causal attention of every sequence in ``seqs`` (its K/V already in the cache): ``query``
        [num_tokens, num_heads, head_dim] (rows may be strided) -> the same rows of ``out`` (same
        shape, contiguous); rows of other sequences are left alone."""
        num_heads, head_dim = query.shape[1:]
        num_kv_heads, num_blocks, block_size, _ = key_cache.shape
        query = _rows_strided(query)
        tables = seqs.block_tables
        status = getattr(self.library, "paged_prefill_attention_" + _SUFFIX[query.dtype])(
            query.data_ptr(), query.stride(0), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(),
            tables.shape[1], seqs.query_start.data_ptr(), seqs.query_len.data_ptr(), seqs.context_lens.data_ptr(),
            out.data_ptr(), out.stride(0), len(seqs.query_len), num_heads, num_kv_heads, head_dim, num_blocks,
            block_size, scale, torch.get_num_threads(),
        )
        if status != 0:
            raise MemoryError("the CPU prefill-attention kernel could not allocate its buffers")

    @property
    def has_bf16_linear(self) -> bool:
        """True where the library was built with AVX-512 BF16 (this CPU has it)."""
        return bool(self.library.bf16_linear_available())

    def fuses_swiglu(self, dtype: torch.dtype) -> bool:
        """True where the linear of ``dtype`` takes the MLP's SwiGLU activation inside it
        (``swiglu=True``): fp32 everywhere (block codes, uint8 and int8, too), bf16 with AVX-512 BF16."""
        return dtype in (torch.float32, torch.uint8, torch.int8) or (dtype == torch.bfloat16 and self.has_bf16_linear)

    def pack_bf16_linear(self, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor | None:
        """``weight`` [N, K] -> the layout ``bf16_linear`` reads ([N / 16][K / 2][16][2] bf16), or None
        where it does not apply (no AVX-512 BF16, not bf16, N not a multiple of 16, K odd). ``swiglu``:
        ``weight`` is a fused gate/up projection (gate rows first), packed with its panels interleaved
        for ``bf16_linear(..., swiglu=True)`` (N a multiple of 32)."""
        out_features, in_features = weight.shape
        if (not self.has_bf16_linear or weight.dtype != torch.bfloat16 or out_features % (32 if swiglu else 16)
                or in_features % 2):
            return None
        panels = self.swiglu_order(weight.detach(), torch.bfloat16) if swiglu else weight.detach()
        return panels.reshape(out_features // 16, 16, in_features // 2, 2).permute(0, 2, 1, 3).contiguous()

    def bf16_linear(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                    out_dtype: torch.dtype = torch.bfloat16, swiglu: bool = False) -> torch.Tensor:
        """``x @ W.T + bias`` for ``x`` [M, K] bf16 (rows may be strided), ``packed`` from
        ``pack_bf16_linear``, ``bias`` fp32 [N] (in the packed column order: ``swiglu_panel_order``
        with ``swiglu``) or None -> a new [M, N] tensor in ``out_dtype`` (bfloat16, or float32: the
        fp32 sums, not rounded to bf16). ``swiglu``: ``silu(gate) * up`` instead, [M, N / 2] bf16."""
        rows, in_features = x.shape
        out_features = packed.shape[0] * 16
        width = out_features // 2 if swiglu else out_features
        x = _last_dim_contiguous(x)
        out = torch.empty((rows, width), dtype=torch.bfloat16 if swiglu else out_dtype)
        status = self.library.bf16_linear(
            x.data_ptr(), x.stride(0), packed.data_ptr(), _pointer(bias), out.data_ptr(), width, rows,
            out_features, in_features, int(out.dtype == torch.float32), int(swiglu), torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError("the bf16 linear kernel refused its shapes")
        return out

    def pack_f32_linear(self, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor | None:
        """``weight`` [N, K] fp32 -> the layout ``f32_linear`` reads ([N / 16][K][16]), or None where it
        does not apply (not fp32, N not a multiple of 16, of 32 with ``swiglu``; as for
        ``pack_bf16_linear``)."""
        out_features, in_features = weight.shape
        if weight.dtype != torch.float32 or out_features % (32 if swiglu else 16):
            return None
        panels = self.swiglu_order(weight.detach()) if swiglu else weight.detach()
        return panels.reshape(out_features // 16, 16, in_features).permute(0, 2, 1).contiguous()

    def f32_linear(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   swiglu: bool = False) -> torch.Tensor:
        """``x @ W.T + bias`` for ``x`` [M, K] fp32 (rows may be strided), ``packed`` from
        ``pack_f32_linear``, ``bias`` fp32 [N] or None (as for ``bf16_linear``) -> a new [M, N] fp32
        tensor; ``swiglu``: ``silu(gate) * up`` instead, [M, N / 2]."""
        rows, in_features = x.shape
        out_features = packed.shape[0] * 16
        width = out_features // 2 if swiglu else out_features
        x = _last_dim_contiguous(x)
        out = torch.empty((rows, width), dtype=torch.float32)
        self.library.f32_linear(x.data_ptr(), x.stride(0), packed.data_ptr(), _pointer(bias), out.data_ptr(),
                                width, rows, out_features, in_features, int(swiglu), torch.get_num_threads())
        return out

    def pack_coded_linear(self, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor | None:
        """``weight`` [N, K] fp32 whose values are exact block codes (``block_codes``: Q4_1, Q8_0) ->
        the layout ``coded_linear`` reads ([N / 16, K / 32, bytes]: uint8 for 4-bit codes, int8 for
        8-bit); None for any other weight, N not a multiple of 16 (32 with ``swiglu``: packed as for
        ``pack_f32_linear``), or with ``block_codes`` off."""
        from hetero_core.model.block_codes import block_codes, pack_code_panels

        if not self.block_codes or weight.dtype != torch.float32 or weight.shape[0] % (32 if swiglu else 16):
            return None
        found = block_codes(self.swiglu_order(weight.detach()) if swiglu else weight)
        return None if found is None else pack_code_panels(*found)

    def coded_linear(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                     swiglu: bool = False) -> torch.Tensor:
        """``f32_linear`` with ``packed`` from ``pack_coded_linear``: the same result, bit for bit, as
        ``f32_linear`` on the fp32 weight it was packed from."""
        rows, in_features = x.shape
        out_features = packed.shape[0] * 16
        width = out_features // 2 if swiglu else out_features
        bits = code_bits(packed)
        x = _last_dim_contiguous(x)
        out = torch.empty((rows, width), dtype=torch.float32)
        status = self.library.coded_linear(x.data_ptr(), x.stride(0), packed.data_ptr(), _pointer(bias),
                                           out.data_ptr(), width, rows, out_features, in_features, bits, int(swiglu),
                                           torch.get_num_threads())
        if status != 0:
            raise MemoryError("the coded linear kernel could not allocate its expansion buffer")
        return out

    def swiglu_order(self, gate_up: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``gate_up``'s rows (or bias) in the order the linear of ``dtype`` takes for ``swiglu``."""
        return swiglu_panel_order(gate_up, 16 if dtype == torch.bfloat16 else self.swiglu_pair_columns)

    def handles(self, tensor: torch.Tensor, width: int) -> bool:
        """True for a CPU tensor of a dtype the element-wise kernels compute, rows ``width`` wide
        (they work ``LANES`` elements at a time)."""
        return tensor.device.type == "cpu" and tensor.dtype in _SUFFIX and width % LANES == 0

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """``weight * x / rms(x)`` over the last dimension of ``x`` [rows, hidden] (rows may be
        strided); with ``residual`` (same shape, updated in place) of ``residual + x`` instead."""
        rows, hidden = x.shape
        x = _last_dim_contiguous(x)
        out = torch.empty((rows, hidden), dtype=x.dtype)
        if residual is not None:
            residual_ptr, residual_stride = residual.data_ptr(), residual.stride(0)
        else:
            residual_ptr, residual_stride = None, 0
        getattr(self.library, "rms_norm_" + _SUFFIX[x.dtype])(
            x.data_ptr(), x.stride(0), residual_ptr, residual_stride, weight.data_ptr(), out.data_ptr(), hidden,
            rows, hidden, eps, torch.get_num_threads(),
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for ``gate_up`` [rows, 2 * width] (gate first) -> [rows, width]."""
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        gate_up = _last_dim_contiguous(gate_up)
        out = torch.empty((rows, width), dtype=gate_up.dtype)
        getattr(self.library, "silu_mul_" + _SUFFIX[gate_up.dtype])(
            gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), width, rows, width, torch.get_num_threads(),
        )
        return out

    def rotary_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate-half RoPE in place: ``x`` [tokens, heads, head_dim] (tokens may be strided, heads
        and dims contiguous), ``cos``/``sin`` [tokens, 1, head_dim // 2] contiguous, x's dtype."""
        tokens, heads, head_dim = x.shape
        if x.stride(2) != 1 or x.stride(1) != head_dim or not (cos.is_contiguous() and sin.is_contiguous()):
            raise ValueError("rotary_: x needs contiguous heads and cos/sin contiguous rows")
        getattr(self.library, "rotary_" + _SUFFIX[x.dtype])(
            x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), tokens, heads, head_dim,
            torch.get_num_threads(),
        )


def code_bits(packed: torch.Tensor) -> int:
    """The code width of a weight from ``pack_coded_linear``: 4 (uint8) or 8 (int8)."""
    return 4 if packed.dtype == torch.uint8 else 8


def swiglu_panel_order(gate_up: torch.Tensor, columns: int) -> torch.Tensor:
    """A fused gate/up projection's rows (or bias), gate first, reordered to the kernels' SwiGLU order:
    ``columns`` gate rows, the ``columns`` up rows of the same outputs, the next gate rows, ..."""
    size = gate_up.shape[0] // 2
    halves = gate_up.reshape(2, size // columns, columns, *gate_up.shape[1:])
    return halves.transpose(0, 1).reshape(gate_up.shape)


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _last_dim_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _rows_strided(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` [rows, heads, dim] with heads and dims contiguous (rows may be strided); else a copy."""
    if tensor.stride(2) != 1 or tensor.stride(1) != tensor.shape[2]:
        return tensor.contiguous()
    return tensor


def load_cpu_kernels(required: bool = False) -> CpuKernels | None:
    """The kernels, built on first use; None (or, if ``required``, KernelUnavailable) when they cannot be."""
    try:
        return _load()
    except KernelUnavailable as exc:
        if required:
            raise
        _log_fallback_once(str(exc))
        return None


@cache
def _load() -> CpuKernels:
    path = _build()
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelUnavailable(f"cannot load {path}: {exc}") from None
    for name, argtypes in _SIGNATURES.items():
        for symbol in [name] if name in _UNTYPED else [f"{name}_{suffix}" for suffix in _SUFFIX.values()]:
            function = getattr(library, symbol)
            function.argtypes = argtypes
            function.restype = None if name in _VOID else ctypes.c_int  # bf16_linear_available too
    return CpuKernels(library, path, library.swiglu_pair_columns())


def _build() -> Path:
    compiler = os.environ.get(COMPILER_ENV) or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelUnavailable("no C compiler found (install gcc, or set CC)")
    version = _compiler_identity(compiler)
    try:
        texts = [(SOURCE_DIR / name).read_text() for name in (*SOURCES, *HEADERS)]
    except OSError as exc:
        raise KernelUnavailable(f"the kernels' sources are missing from this install: {exc}") from None
    key = hashlib.sha256("\n".join([*texts, compiler, version, " ".join(CFLAGS), " ".join(sorted(cpu_flags())),
                                    cache_file.FOOTER]).encode()).hexdigest()[:16]
    target = default_cache_dir() / "kernels" / f"hetero_cpu_kernels-{key}.so"
    try:
        cache_file.map_checked(target)  # before dlopen: a truncated library faults (SIGBUS) once mapped
        return target
    except FileNotFoundError:
        pass
    except cache_file.CacheFileInvalid as exc:
        cache_file.warn_rebuilding(exc)
    try:
        with cache_file.written_checked(target, ".so") as tmp:  # concurrent builders (tensor-parallel ranks) are fine
            sources = [str(SOURCE_DIR / name) for name in SOURCES]
            result = subprocess.run([compiler, *CFLAGS, "-o", tmp, *sources, "-lm"], capture_output=True, text=True)
            if result.returncode != 0:
                detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
                raise KernelUnavailable(f"{compiler} could not build the CPU kernels: {detail}")
    except OSError as exc:
        raise KernelUnavailable(f"cannot write the CPU kernels to {target}: {exc}") from None
    log.info("executor.cpu_kernels_built", path=str(target))
    return target


def _compiler_identity(compiler: str) -> str:
    """The compiler binary's resolved path, size and modification time: it changes when the compiler
    is upgraded or swapped, and costs a ``stat`` (``cc --version`` costs a process, ~50 ms)."""
    try:
        real = os.path.realpath(compiler)
        stat = os.stat(real)
    except OSError as exc:
        raise KernelUnavailable(f"C compiler {compiler} does not run: {exc}") from None
    return f"{real} {stat.st_size} {stat.st_mtime_ns}"


@cache
def _log_fallback_once(reason: str) -> None:
    log.info("executor.cpu_kernels_unavailable", reason=reason, fallback="torch attention")
