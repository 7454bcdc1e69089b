"""Options of the cuda executor (section ``[executor.cuda]``); imports no torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CudaExecutorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field("cuda", description="CUDA device to run on, e.g. 'cuda' or 'cuda:1'")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="weights, activations and KV cache dtype; flash-attn takes bfloat16 or float16 only",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="size the KV pool from this share of the GPU's memory after a profiling forward "
        "(at most max_num_blocks blocks); unset: exactly max_num_blocks blocks",
    )
    cuda_graphs: bool = Field(True, description="replay decode steps from CUDA graphs; false: eager mode")
    cuda_graph_batch_sizes: list[int] | None = Field(
        None,
        description="decode batch sizes to capture (a step is padded up to the next one); "
        "unset: 1, 2, 4, 8, then every 16 up to max_batch_size",
    )

    @field_validator("cuda_graph_batch_sizes")
    @classmethod
    def _positive_sorted(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is None:
            return None
        if not sizes or any(size < 1 for size in sizes):
            raise ValueError("give one or more batch sizes, each >= 1")
        return sorted(set(sizes))
