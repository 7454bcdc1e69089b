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
- ``q8a_coded_linear.c``: the same block codes against activations quantized to int8 per row and
  block of 32 inputs, summed in integers (AVX-512 VNNI, AVX2), scales applied per block in a fixed
  order: batch-invariant, 2-3x the fp32 kernel at batched decodes (``code_activations``); and
  ``q8a_coded_linear_amx.c``, its integer sums on AMX-INT8 tiles for calls of many rows, the same bits
  (compiled where ``-march=native`` targets AMX-INT8, live once ``model/cpu/amx_int8.py`` enables it);
- ``decode_layers.c``: every decoder layer of a pure decode step in one call, the kernels above in
  the model code's order (``fused_decode``);
- ``int8_linear.c``: int8 weights (per output channel) with fp32/bf16 activations, or with the
  activations quantized per token and int32 sums through AVX-512 VNNI (``quantization``, ``int8``);
- ``bf16_linear_amx.c``: the bf16 linear on AMX tiles, live only in the AMX variant of the library
  (``extra_flags``, ``model/cpu/amx.py``) once the kernel grants this process the tiles.

Every entry point takes any number of rows, tokens or sequences (none too) and checks its shapes
(a ValueError here, -1 from the C side); every row's result is one fixed-order computation,
whatever else is in the batch and however many threads run it (batch invariance; no
``-fassociative-math``). The calls' wrappers: ``kernel_attention``, ``kernel_pointwise``,
``kernel_linears``; this module builds and loads the library. Its ABI is written once, in
``csrc/hetero_kernels.h``: every source includes it and ``kernel_abi`` types the ctypes calls from it.

They have no Python or torch headers and need GCC (its vector extensions; ``$CC`` or ``cc``); each
source compiles in its own compiler process, as many at once as there are cores (about a minute on
two: the block-code linears' per-kind copies of their loops are most of it), and the shared library
is cached under ``~/.cache/hetero/kernels``
(``HETERO_CACHE_DIR``), keyed by the sources, the compiler and this CPU's own flags
(``hardware_cpu_flags``, never the reported ones), with a checksum footer (``cache_file``) checked
before it is loaded: a damaged library is rebuilt, never mapped.

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
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hetero_core.cache import cache_file
from hetero_core.cache.cache_dir import default_cache_dir
from hetero_core.logging import get_logger
from hetero_core.model.cpu.cpu_info import hardware_cpu_flags
from hetero_core.model.cpu.kernel_abi import kernel_signatures
from hetero_core.model.cpu.kernel_attention import AttentionKernels
from hetero_core.model.cpu.kernel_int8 import Int8Kernels
from hetero_core.model.cpu.kernel_linears import LinearKernels
from hetero_core.model.cpu.kernel_pointwise import PointwiseKernels

log = get_logger("hetero.executor")

SOURCE_DIR = Path(__file__).with_name("csrc")
SOURCES = (
    "paged_kv_write.c",
    "paged_decode_attention.c",
    "paged_prefill_attention.c",
    "pointwise.c",
    "bf16_linear.c",
    "f32_linear.c",
    "decode_layers.c",
    "bf16_linear_amx.c",
    "int8_linear.c",
    "q8a_coded_linear.c",
    "q8a_coded_linear_amx.c",
)
HEADERS = (
    "hetero_kernels.h",
    "kernel_math.h",
    "attention_math.h",
    "amx_emulation.h",
    "amx_tiles.h",
    "code_blocks.h",
    "q8a_rows.h",
)
COMPILER_ENV = "CC"
# No -fassociative-math: the kernels' sums run in the order written, the same in every kernel and for
# every batch (batch invariance; attention_math.h).
CFLAGS = (
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fno-signed-zeros",
    "-fno-trapping-math",
    "-fopenmp",
    "-shared",
    "-fPIC",
)


class KernelUnavailable(Exception):
    """The kernels cannot be built or loaded here; the message says why."""


@dataclass(frozen=True)
class CpuKernels(AttentionKernels, PointwiseKernels, LinearKernels, Int8Kernels):
    """The loaded library and its calls: attention (``AttentionKernels``), the element-wise steps
    (``PointwiseKernels``) and the linears (``LinearKernels``, ``Int8Kernels``). Every call takes
    any number of rows, tokens or sequences, none included, and checks the shapes it is given: a
    ValueError names what
    does not fit (the C entry points check again and write nothing)."""

    library: ctypes.CDLL
    path: Path
    # How the fp32 linear wants a fused gate/up weight's rows interleaved for SwiGLU (swiglu_panel_order):
    # 16 with 16-lane vectors (AVX-512), 8 with narrower ones (a pair in one 16-column panel).
    swiglu_pair_columns: int = 16
    block_codes: bool = True  # pack_coded_linear looks for block-code weights (False: it never does)
    # How block-code linears take their activations: "int8" (q8a_coded_linear, where VNNI or AVX2 sums
    # them: int8_code_activations) or "float" (coded_linear, exact fp32: the torch option code_activations)
    code_activations: str = "float"
    amx: bool = False  # the AMX variant, granted its tiles: bf16_linear runs on them (model/cpu/amx.py)
    # int8 code activations: calls of at least this many rows sum on AMX-INT8 tiles, the same bits (0:
    # never; set by model/cpu/amx_int8.py once the CPU, Linux and a self-check allow it)
    code_tile_rows: int = 0


def load_cpu_kernels(
    required: bool = False, extra_flags: tuple[str, ...] = (), cache_dir: Path | None = None
) -> CpuKernels | None:
    """The kernels, built on first use; None (or, if ``required``, KernelUnavailable) when they cannot be.
    ``extra_flags``: a variant of the library built with these compiler flags too (its own file);
    ``cache_dir``: the cache the library is built into and found in at its first load in this process
    (``kernels/`` there; default ``default_cache_dir()``: ``$HETERO_CACHE_DIR`` or ``~/.cache/hetero``);
    later loads of the same variant return the library already loaded, wherever it came from."""
    try:
        return _load(extra_flags, Path(cache_dir) if cache_dir is not None else default_cache_dir())
    except KernelUnavailable as exc:
        if required:
            raise
        _log_fallback_once(str(exc))
        return None


class _Loaded:
    """The libraries loaded in this process, one per variant (``extra_flags``): a process maps one
    library of each, whatever cache a later caller names. ``cache_clear`` forgets them (tests)."""

    def __init__(self) -> None:
        self._libraries: dict[tuple[str, ...], CpuKernels] = {}

    def __call__(self, extra_flags: tuple[str, ...], cache_dir: Path) -> CpuKernels:
        if extra_flags not in self._libraries:
            self._libraries[extra_flags] = _load_library(extra_flags, cache_dir)
        return self._libraries[extra_flags]

    def cache_clear(self) -> None:
        self._libraries.clear()


_load = _Loaded()


def _load_library(extra_flags: tuple[str, ...], cache_dir: Path) -> CpuKernels:
    path = _build(extra_flags, cache_dir)
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelUnavailable(f"cannot load {path}: {exc}") from None
    for name, argtypes in kernel_signatures().items():  # csrc/hetero_kernels.h: every call returns a status
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    return CpuKernels(library, path, library.swiglu_pair_columns())


def _build(extra_flags: tuple[str, ...], cache_dir: Path) -> Path:
    compiler = os.environ.get(COMPILER_ENV) or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelUnavailable("no C compiler found (install gcc, or set CC)")
    version = _compiler_identity(compiler)
    try:
        texts = [(SOURCE_DIR / name).read_text() for name in (*SOURCES, *HEADERS)]
    except OSError as exc:
        raise KernelUnavailable(f"the kernels' sources are missing from this install: {exc}") from None
    flags = (*CFLAGS, *extra_flags)
    cpu = " ".join(sorted(hardware_cpu_flags()))
    key = hashlib.sha256(
        "\n".join([*texts, compiler, version, " ".join(flags), cpu, cache_file.FOOTER]).encode()
    ).hexdigest()[:16]
    variant = "-variant" if extra_flags else ""
    target = cache_dir / "kernels" / f"hetero_cpu_kernels{variant}-{key}.so"
    try:
        cache_file.map_checked(target)  # before dlopen: a truncated library faults (SIGBUS) once mapped
        return target
    except FileNotFoundError:
        pass
    except cache_file.CacheFileInvalid as exc:
        cache_file.warn_rebuilding(exc)
    try:
        with cache_file.written_checked(
            target, ".so"
        ) as tmp:  # concurrent builders (tensor-parallel ranks) are fine
            _compile_and_link(compiler, flags, tmp)
    except OSError as exc:
        raise KernelUnavailable(f"cannot write the CPU kernels to {target}: {exc}") from None
    log.info("executor.cpu_kernels_built", path=str(target))
    return target


def _compile_and_link(compiler: str, flags: tuple[str, ...], output: str) -> None:
    """Every source compiled to an object at once (one compiler process per source, as many running as
    this process may use cores: the block-code linears take most of the ~1 min), then linked."""
    workers = max(1, min(len(SOURCES), len(os.sched_getaffinity(0))))
    with tempfile.TemporaryDirectory(prefix="hetero-kernels-") as build:
        objects = [str(Path(build) / f"{Path(name).stem}.o") for name in SOURCES]
        compile_flags = tuple(flag for flag in flags if flag != "-shared")
        commands = [
            [compiler, *compile_flags, "-c", "-o", obj, str(SOURCE_DIR / name)]
            for name, obj in zip(SOURCES, objects, strict=True)
        ]
        commands.sort(key=lambda command: -os.stat(command[-1]).st_size)  # the largest first
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(_run, commands))
        results.append(_run([compiler, *flags, "-o", output, *objects, "-lm"]))
    for result in results:
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise KernelUnavailable(f"{compiler} could not build the CPU kernels: {detail}")


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


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
