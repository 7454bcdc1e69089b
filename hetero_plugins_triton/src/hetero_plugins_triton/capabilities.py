"""What the Triton kernels can run, checked before any weight is loaded; imports no torch or triton."""

from __future__ import annotations

# Tokens per KV block (the engine's ``block_size``): the kernels find a token's page with a shift
# and a mask of this constexpr.
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
# head_dim is padded to a power of two >= 16 inside the kernels; above 256 the prefill tile's
# accumulator no longer fits in registers.
MIN_HEAD_DIM, MAX_HEAD_DIM, HEAD_DIM_MULTIPLE = 16, 256, 8
GPU_DTYPES = ("float16", "bfloat16", "float32")
INTERPRETER_DTYPES = ("float32",)  # numpy, which runs the interpreter, has no bfloat16

CAPABILITIES = {
    "block_sizes": BLOCK_SIZES,
    "head_dims": f"multiples of {HEAD_DIM_MULTIPLE} from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}",
    "dtypes": {"gpu": GPU_DTYPES, "interpreter": INTERPRETER_DTYPES},
}


def incompatibilities(
    *,
    block_size: int,
    head_dim: int,
    num_heads: int,
    num_kv_heads: int,
    dtype: str,
    interpret: bool,
    bf16_supported: bool = True,
) -> list[str]:
    """Reasons the kernels cannot run this model and these settings (empty when they can)."""
    reasons = []
    if block_size not in BLOCK_SIZES:
        reasons.append(
            f"block_size {block_size} is not supported; use one of {', '.join(map(str, BLOCK_SIZES))}"
        )
    if not (MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM and head_dim % HEAD_DIM_MULTIPLE == 0):
        reasons.append(
            f"the model's head_dim {head_dim} is not supported; the kernels take {CAPABILITIES['head_dims']}"
        )
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        reasons.append(f"{num_heads} query heads do not divide into {num_kv_heads} KV heads")
    allowed = INTERPRETER_DTYPES if interpret else GPU_DTYPES
    if dtype not in allowed:
        where = "in interpreter mode" if interpret else "on the GPU"
        reasons.append(f"dtype {dtype} is not supported {where}; use {' or '.join(allowed)}")
    elif dtype == "bfloat16" and not bf16_supported:
        reasons.append("this GPU has no bfloat16 support; use dtype = 'float16'")
    return reasons
