"""The compiled CPU decode-attention kernel: built once with the system C compiler, called via ctypes.

Torch has no paged attention for the CPU: the pure-torch path gathers every sequence's KV blocks
into a padded copy, then runs two batched matmuls whose tiny shapes (a few query rows against
one context) MKL handles poorly. ``cpu_kernels/paged_decode_attention.c`` reads K and V straight
from the block tables instead, each once, with the dot products vectorised for this CPU
(``-march=native``). It has no Python or torch headers, so it compiles in about a second; the
shared library is cached under ``~/.cache/hetero/kernels`` (``HETERO_CACHE_DIR``), keyed by the
source, the compiler and this CPU's flags.

Where no C compiler works the torch path runs instead (``load_decode_kernel`` returns None and
says why, once). The executor option ``cpu_attention`` chooses: ``auto`` (the kernel when it
builds), ``kernel`` (required: an error if it cannot build), ``torch`` (never).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from hetero_core.logging import get_logger
from hetero_core.model.compute_dtype import cpu_flags
from hetero_core.model.gguf_cache import default_cache_dir

log = get_logger("hetero.executor")

SOURCE = Path(__file__).with_name("cpu_kernels") / "paged_decode_attention.c"
COMPILER_ENV = "CC"
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
          "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC")
MAX_HEAD_DIM, MAX_GROUP = 512, 64  # the kernel's fixed limits (paged_decode_attention.c)
_FUNCTIONS = {torch.float32: "paged_decode_attention_f32", torch.bfloat16: "paged_decode_attention_bf16"}
_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
             ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_int]


class KernelUnavailable(Exception):
    """The kernel cannot be built or loaded here; the message says why."""


@dataclass(frozen=True)
class DecodeKernel:
    library: ctypes.CDLL
    path: Path

    def supports(self, query: torch.Tensor, num_kv_heads: int) -> bool:
        """True for a CPU query of a dtype, head size and group size the kernel handles."""
        num_heads, head_dim = query.shape[1:]
        return (query.device.type == "cpu" and query.dtype in _FUNCTIONS and head_dim <= MAX_HEAD_DIM
                and num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= MAX_GROUP)

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """``query`` [num_seqs, num_heads, head_dim] (rows may be strided, heads and dims contiguous),
        caches [num_kv_heads, num_blocks, block_size, head_dim] contiguous, ``block_tables``
        [num_seqs, max_blocks] int64 (padded), ``context_lens`` [num_seqs] int64 -> a new
        [num_seqs, num_heads, head_dim] tensor."""
        num_seqs, num_heads, head_dim = query.shape
        num_kv_heads, num_blocks, block_size, _ = key_cache.shape
        if query.stride(2) != 1 or query.stride(1) != head_dim:
            query = query.contiguous()
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=query.dtype)
        status = getattr(self.library, _FUNCTIONS[query.dtype])(
            query.data_ptr(), query.stride(0), key_cache.data_ptr(), value_cache.data_ptr(),
            block_tables.data_ptr(), block_tables.shape[1], context_lens.data_ptr(), out.data_ptr(),
            num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size, scale, torch.get_num_threads(),
        )
        if status != 0:
            raise MemoryError("the CPU decode-attention kernel could not allocate its score buffers")
        return out


def load_decode_kernel(required: bool = False) -> DecodeKernel | None:
    """The kernel, built on first use; None (or, if ``required``, KernelUnavailable) when it cannot be."""
    try:
        return _load()
    except KernelUnavailable as exc:
        if required:
            raise
        _log_fallback_once(str(exc))
        return None


@cache
def _load() -> DecodeKernel:
    path = _build()
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelUnavailable(f"cannot load {path}: {exc}") from None
    for name in _FUNCTIONS.values():
        function = getattr(library, name)
        function.argtypes = _ARGTYPES
        function.restype = ctypes.c_int
    return DecodeKernel(library, path)


def _build() -> Path:
    compiler = os.environ.get(COMPILER_ENV) or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelUnavailable("no C compiler found (install gcc, or set CC)")
    version = _compiler_version(compiler)
    try:
        source = SOURCE.read_text()
    except OSError as exc:
        raise KernelUnavailable(f"the kernel's source is missing from this install: {exc}") from None
    key = hashlib.sha256("\n".join([source, compiler, version, " ".join(CFLAGS),
                                    " ".join(sorted(cpu_flags()))]).encode()).hexdigest()[:16]
    target = default_cache_dir() / "kernels" / f"paged_decode_attention-{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *CFLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True)
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise KernelUnavailable(f"{compiler} could not build the kernel: {detail}")
        os.replace(tmp, target)  # atomic: concurrent builders (tensor-parallel ranks) are fine
        log.info("executor.decode_kernel_built", path=str(target))
        return target
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compiler_version(compiler: str) -> str:
    try:
        result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelUnavailable(f"C compiler {compiler} does not run: {exc}") from None
    if result.returncode != 0:
        raise KernelUnavailable(f"C compiler {compiler} does not run (exit {result.returncode})")
    return result.stdout.splitlines()[0] if result.stdout else ""


@cache
def _log_fallback_once(reason: str) -> None:
    log.info("executor.decode_kernel_unavailable", reason=reason, fallback="torch decode attention")
