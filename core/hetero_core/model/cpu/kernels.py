"""The compiled CPU attention kernels: built once with the system C compiler, called via ctypes.

Torch has no paged attention for the CPU: the pure-torch path gathers every sequence's KV blocks
into a padded copy for decodes, runs one SDPA call per prefilling sequence (~0.2 ms of overhead
each, 30 layers x 32 prompts per step), and writes new K/V with ``index_copy_`` from strided rows
(~1.5 ms per layer for a 2,400-token prefill in bf16). The C sources in ``csrc/`` do all three
straight on the block-table cache, vectorised for this CPU (``-march=native``):

- ``paged_kv_write.c``: the step's new K/V rows into their slots;
- ``paged_decode_attention.c``: single-token queries, K and V each read once;
- ``paged_prefill_attention.c``: every multi-token query of a step in one call (causal, any cached
  prefix), flash-attention style in fp32; both attention kernels compute a query row with the same
  arithmetic (``attention_math.h``), so a token gets the same bits from either;
- ``pointwise.c``: the model's element-wise steps (residual add + RMSNorm, SiLU-and-multiply, RoPE
  in place), one pass each instead of 5-7 eager torch ops;
- ``bf16_linear.c``: bf16 linears over a weight packed once at load (AVX-512 BF16 dot products, or
  the weight widened to fp32 in registers on other CPUs), overlapping the weight stream with compute
  better than oneDNN at decode sizes;
- ``f32_linear.c``: fp32 linears the same way, with fused multiply-adds of any vector width (the
  default dtype of CPUs without bf16 arithmetic, AVX2-only ones); and ``coded_linear``, the same
  over weights that are exact block codes (a Q4_1 or Q8_0 GGUF's), expanded as they stream in:
  bit-identical results from 0.75 or 1.25 instead of 4 bytes per weight (``block_codes``);
- ``decode_layers.c``: every decoder layer of a pure decode step in one call, the kernels above in
  the model code's order (``fused_decode``).

Every entry point takes any number of rows, tokens or sequences (none too) and checks its shapes
(a ValueError here, -1 from the C side); every row's result is one fixed-order computation,
whatever else is in the batch and however many threads run it (batch invariance; no
``-fassociative-math``). The linears' wrappers are in ``cpu_kernel_linears``.

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
from functools import cache, cached_property
from pathlib import Path

import torch

from hetero_core.logging import get_logger
from hetero_core.cache import cache_file
from hetero_core.model.cpu.cpu_info import cpu_flags
from hetero_core.model.cpu.kernel_linears import LinearKernels, check_status, last_dim_contiguous, pointer
from hetero_core.cache.cache_dir import default_cache_dir

log = get_logger("hetero.executor")

SOURCE_DIR = Path(__file__).with_name("csrc")
SOURCES = ("paged_kv_write.c", "paged_decode_attention.c", "paged_prefill_attention.c", "pointwise.c",
           "bf16_linear.c", "f32_linear.c", "decode_layers.c")
HEADERS = ("kernel_math.h", "attention_math.h")
COMPILER_ENV = "CC"
# No -fassociative-math: the kernels' sums run in the order written, the same in every kernel and for
# every batch (batch invariance; attention_math.h).
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-signed-zeros", "-fno-trapping-math", "-fopenmp",
          "-shared", "-fPIC")
MAX_HEAD_DIM, MAX_GROUP = 512, 64  # the kernels' fixed limits (paged_decode_attention.c)
LANES = 16  # attention's head sizes are multiples of this (of every ISA's LANES in kernel_math.h)
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
    "bf16_linear_native": [],
    "swiglu_pair_columns": [],
    "decode_layers": [_PTR, _PTR],
    "f32_linear": [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int],
    "coded_linear": [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int, ctypes.c_int],
}
_UNTYPED = ("paged_kv_write", "bf16_linear", "bf16_linear_native", "swiglu_pair_columns", "f32_linear",
            "coded_linear", "decode_layers")  # one symbol for every dtype
_VOID = ()  # every kernel returns a status (0 done, -1 refused, -2 out of memory)
DECODE_ATTENTION_REFUSED = ("the CPU decode-attention kernel refused its inputs (a context beyond its block "
                            "table, a block or slot outside the cache)")


class KernelUnavailable(Exception):
    """The kernels cannot be built or loaded here; the message says why."""


@dataclass(frozen=True)
class PrefillSequences:
    """The multi-token queries of a step, as the prefill kernel reads them (int64 tensors)."""

    query_start: torch.Tensor  # [num_seqs] each sequence's first row in the flat batch
    query_len: torch.Tensor  # [num_seqs] its rows (new tokens)
    context_lens: torch.Tensor  # [num_seqs] its tokens in the cache after this step's write
    block_tables: torch.Tensor  # [num_seqs, max_blocks] padded

    def __post_init__(self) -> None:
        num_seqs = len(self.query_len)
        for name in ("query_start", "query_len", "context_lens"):
            _check_index("PrefillSequences", name, getattr(self, name), (num_seqs,))
        _check_index("PrefillSequences", "block_tables", self.block_tables, (num_seqs, self.block_tables.shape[-1]))

    @cached_property
    def num_rows(self) -> int:
        """The query rows the sequences reach (their last row + 1)."""
        return int((self.query_start + self.query_len).max()) if len(self.query_len) else 0


@dataclass(frozen=True)
class CpuKernels(LinearKernels):
    """The loaded library and its calls (the linears' in ``LinearKernels``). Every call takes any
    number of rows, tokens or sequences, none included, and checks the shapes it is given: a
    ValueError names what does not fit (the C entry points check again and write nothing)."""

    library: ctypes.CDLL
    path: Path
    # How the fp32 linear wants a fused gate/up weight's rows interleaved for SwiGLU (swiglu_panel_order):
    # 16 with 16-lane vectors (AVX-512), 8 with narrower ones (a pair in one 16-column panel).
    swiglu_pair_columns: int = 16
    block_codes: bool = True  # pack_coded_linear looks for block-code weights (False: it never does)

    def supports(self, query: torch.Tensor, num_kv_heads: int) -> bool:
        """True for a CPU query of a dtype, head size and group size the attention kernels handle."""
        num_heads, head_dim = query.shape[1:]
        return (query.device.type == "cpu" and query.dtype in _SUFFIX and 0 < head_dim <= MAX_HEAD_DIM
                and head_dim % LANES == 0 and num_kv_heads > 0 and num_heads % num_kv_heads == 0
                and num_heads // num_kv_heads <= MAX_GROUP)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slots: torch.Tensor) -> None:
        """``key``/``value`` [num_tokens, num_kv_heads, head_dim] (rows may be strided, heads and dims
        contiguous) into caches [num_kv_heads, num_blocks, block_size, head_dim] at ``slots`` [num_tokens]
        int64 (``block * block_size + offset``)."""
        num_tokens, num_kv_heads, head_dim = key.shape
        _check_cache("write_kv", key_cache, value_cache, key.dtype, num_kv_heads, head_dim)
        if value.shape != key.shape or value.dtype != key.dtype:
            raise ValueError(f"write_kv: value {tuple(value.shape)} does not match key {tuple(key.shape)}")
        _check_index("write_kv", "slots", slots, (num_tokens,))
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
        _check_cache("attend_decode", key_cache, value_cache, query.dtype, num_kv_heads, head_dim)
        _check_index("attend_decode", "block_tables", block_tables, (num_seqs, block_tables.shape[-1]))
        _check_index("attend_decode", "context_lens", context_lens, (num_seqs,))
        query = _rows_strided(query)
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=query.dtype)
        new_key = new_value = slots = None
        if new_kv is not None:
            new_key, new_value, slots = _rows_strided(new_kv[0]), _rows_strided(new_kv[1]), new_kv[2]
            if new_key.shape != (num_seqs, num_kv_heads, head_dim) or new_value.shape != new_key.shape:
                raise ValueError(f"attend_decode: the new K/V must be [{num_seqs}, {num_kv_heads}, {head_dim}], got "
                                 f"{tuple(new_key.shape)} and {tuple(new_value.shape)}")
            _check_index("attend_decode", "slots", slots, (num_seqs,))
            if new_key.stride(0) != new_value.stride(0):  # the kernel takes one token stride for both
                new_key, new_value = new_key.contiguous(), new_value.contiguous()
        status = getattr(self.library, "paged_decode_attention_" + _SUFFIX[query.dtype])(
            query.data_ptr(), query.stride(0), pointer(new_key), pointer(new_value),
            0 if new_key is None else new_key.stride(0), pointer(slots), key_cache.data_ptr(),
            value_cache.data_ptr(), block_tables.data_ptr(), block_tables.shape[1], context_lens.data_ptr(),
            out.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size, scale,
            torch.get_num_threads(),
        )
        if status == -1:
            raise ValueError(DECODE_ATTENTION_REFUSED)
        check_status(status, "decode-attention", f"{num_seqs} sequences")
        return out

    def attend_prefill(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       seqs: PrefillSequences, scale: float, out: torch.Tensor) -> None:
        """Causal attention of every sequence in ``seqs`` (its K/V already in the cache): ``query``
        [num_tokens, num_heads, head_dim] (rows may be strided) -> the same rows of ``out`` (same
        shape, contiguous); rows of other sequences are left alone."""
        num_tokens, num_heads, head_dim = query.shape
        num_kv_heads, num_blocks, block_size, _ = key_cache.shape
        _check_cache("attend_prefill", key_cache, value_cache, query.dtype, num_kv_heads, head_dim)
        num_seqs = len(seqs.query_len)
        if seqs.num_rows > num_tokens:
            raise ValueError(f"attend_prefill: a sequence's rows lie beyond the query's {num_tokens} tokens")
        if out.shape != query.shape or out.dtype != query.dtype or not out.is_contiguous():
            raise ValueError(f"attend_prefill: out must be a contiguous {tuple(query.shape)} like the query")
        query = _rows_strided(query)
        tables = seqs.block_tables
        status = getattr(self.library, "paged_prefill_attention_" + _SUFFIX[query.dtype])(
            query.data_ptr(), query.stride(0), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(),
            tables.shape[1], seqs.query_start.data_ptr(), seqs.query_len.data_ptr(), seqs.context_lens.data_ptr(),
            out.data_ptr(), out.stride(0), num_seqs, num_heads, num_kv_heads, head_dim, num_blocks,
            block_size, scale, torch.get_num_threads(),
        )
        check_status(status, "prefill-attention", f"{num_seqs} sequences: a query longer than its context, a "
                                                  "context beyond its block table or a block outside the cache")

    def handles(self, tensor: torch.Tensor, width: int) -> bool:
        """True for a CPU tensor of a dtype the element-wise kernels compute (rows of any width)."""
        return tensor.device.type == "cpu" and tensor.dtype in _SUFFIX and width > 0

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """``weight * x / rms(x)`` over the last dimension of ``x`` [rows, hidden] (rows may be
        strided); with ``residual`` (same shape, updated in place) of ``residual + x`` instead."""
        rows, hidden = x.shape
        if x.dtype not in _SUFFIX or weight.shape != (hidden,) or weight.dtype != x.dtype or not weight.is_contiguous():
            raise ValueError(f"rms_norm: x {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)} needs a contiguous "
                             f"weight [{hidden}] of its dtype, got {tuple(weight.shape)}")
        x = last_dim_contiguous(x)
        out = torch.empty((rows, hidden), dtype=x.dtype)
        residual_ptr, residual_stride = None, 0
        if residual is not None:
            if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1:
                raise ValueError(f"rms_norm: residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
            residual_ptr, residual_stride = residual.data_ptr(), residual.stride(0)
        status = getattr(self.library, "rms_norm_" + _SUFFIX[x.dtype])(
            x.data_ptr(), x.stride(0), residual_ptr, residual_stride, weight.data_ptr(), out.data_ptr(), hidden,
            rows, hidden, eps, torch.get_num_threads(),
        )
        check_status(status, "rms_norm", f"{rows} rows of {hidden}")
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for ``gate_up`` [rows, 2 * width] (gate first) -> [rows, width]."""
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        if gate_up.dtype not in _SUFFIX or gate_up.shape[1] % 2:
            raise ValueError(f"silu_mul: gate_up must be fp32 or bf16 [rows, 2 * width], got {tuple(gate_up.shape)}")
        gate_up = last_dim_contiguous(gate_up)
        out = torch.empty((rows, width), dtype=gate_up.dtype)
        status = getattr(self.library, "silu_mul_" + _SUFFIX[gate_up.dtype])(
            gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), width, rows, width, torch.get_num_threads(),
        )
        check_status(status, "silu_mul", f"{rows} rows of {width}")
        return out

    def rotary_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate-half RoPE in place: ``x`` [tokens, heads, head_dim] (tokens may be strided, heads
        and dims contiguous), ``cos``/``sin`` [tokens, 1, head_dim // 2] contiguous, x's dtype."""
        tokens, heads, head_dim = x.shape
        if x.stride(2) != 1 or x.stride(1) != head_dim or not (cos.is_contiguous() and sin.is_contiguous()):
            raise ValueError("rotary_: x needs contiguous heads and cos/sin contiguous rows")
        if cos.shape != (tokens, 1, head_dim // 2) or sin.shape != cos.shape or cos.dtype != x.dtype or head_dim % 2:
            raise ValueError(f"rotary_: x {tuple(x.shape)} needs cos and sin [{tokens}, 1, {head_dim // 2}] of its "
                             f"dtype (head_dim even), got {tuple(cos.shape)}")
        status = getattr(self.library, "rotary_" + _SUFFIX[x.dtype])(
            x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), tokens, heads, head_dim,
            torch.get_num_threads(),
        )
        check_status(status, "rotary", f"{tokens} tokens of {heads} heads of {head_dim}")


def _check_cache(kernel: str, key_cache: torch.Tensor, value_cache: torch.Tensor, dtype: torch.dtype,
                 num_kv_heads: int, head_dim: int) -> None:
    """Caches [num_kv_heads, num_blocks, block_size, head_dim] of ``dtype``, contiguous, alike."""
    if (key_cache.dim() != 4 or key_cache.shape[0] != num_kv_heads or key_cache.shape[3] != head_dim
            or key_cache.dtype != dtype or value_cache.shape != key_cache.shape or value_cache.dtype != dtype
            or not (key_cache.is_contiguous() and value_cache.is_contiguous()) or key_cache.device.type != "cpu"):
        raise ValueError(f"{kernel}: the caches must be contiguous CPU {str(dtype).removeprefix('torch.')} "
                         f"[{num_kv_heads}, blocks, block_size, {head_dim}] (the query's dtype), got "
                         f"{str(key_cache.dtype).removeprefix('torch.')} {tuple(key_cache.shape)}")


def _check_index(kernel: str, name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tensor.dtype != torch.int64 or tuple(tensor.shape) != shape or not tensor.is_contiguous():
        raise ValueError(f"{kernel}: {name} must be a contiguous int64 {list(shape)}, got "
                         f"{str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}")


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
            function.restype = None if name in _VOID else ctypes.c_int  # bf16_linear_native too
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
