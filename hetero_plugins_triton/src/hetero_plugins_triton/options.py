"""Options of the Triton executor (section ``[executor.triton]``); imports neither torch nor triton."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

TILE_SIZES = (16, 32, 64, 128, 256)


class TritonExecutorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str | None = Field(
        None, description="torch device, e.g. 'cuda:0'; default 'cuda' on a GPU, 'cpu' in interpreter mode"
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto",
        description="weights, activations and KV cache; "
        "'auto': bfloat16 on GPUs that have it (else float16), "
        "float32 in interpreter mode (the only dtype the CPU interpreter runs)",
    )
    interpreter: bool = Field(
        False,
        description="run the Triton kernels through Triton's CPU interpreter "
        "(slow; for testing without a GPU). "
        "TRITON_INTERPRET=1 in the environment turns it on too",
    )
    num_splits: int | None = Field(
        None,
        ge=1,
        le=256,
        description="decode: force this many KV splits per sequence (1 = no split-K); "
        "default: chosen per step "
        "from context length, batch size and the GPU's SM count",
    )
    decode_block_n: int = Field(64, description="decode: KV tokens per kernel iteration")
    prefill_block_m: int = Field(64, description="prefill: query tokens per program")
    prefill_block_n: int = Field(64, description="prefill: KV tokens per kernel iteration")
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads (CPU / interpreter mode)")
    cuda_graphs: bool = Field(
        True,
        description="replay pure decode steps from CUDA graphs captured at start-up (batch sizes 1, 2, 4, 8, "
        "then every 16 up to max_num_seqs; a step is padded up to the next, on one extra scratch KV block); "
        "in interpreter mode the same padded static-input steps run eagerly; false: every step eager",
    )

    @field_validator("decode_block_n", "prefill_block_m", "prefill_block_n")
    @classmethod
    def _tile_size(cls, value: int) -> int:
        if value not in TILE_SIZES:
            raise ValueError(
                f"must be one of {', '.join(map(str, TILE_SIZES))} (a power of two the kernels tile by)"
            )
        return value
