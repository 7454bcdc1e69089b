"""Options of the built-in torch executor (section ``[executor.torch]``); imports no torch."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TorchExecutorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field("cpu", description="torch device to run on, e.g. 'cpu' or 'cuda:0'")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="weights, activations and KV cache dtype"
    )
    num_threads: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="torch intra-op threads on the CPU; default: the CPUs this process may use "
        "(its affinity mask, os.sched_getaffinity)",
    )
    prepack_weights: bool = Field(
        True,
        description="fp32 on CPU: run linears through oneDNN with weights reordered once at load "
        "(2-3x faster than MKL's sgemm on AMD CPUs); false: plain torch.nn.functional.linear",
    )
