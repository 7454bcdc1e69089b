"""Options of core's ``draft`` proposer (section ``[speculative_proposer.draft]``); imports no torch."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EMBEDDED_DRAFT = "smollm2-135m-instruct"


class DraftProposerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        EMBEDDED_DRAFT,
        description="the draft model: the embedded SmolLM2-135M-Instruct (default), a local HF directory, a "
        ".gguf file or a hub id; it must use the target's tokenizer (refused at startup otherwise)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="the draft model's weights, activations and KV dtype (the torch executor's `dtype`)",
    )
    num_blocks: int | None = Field(
        None,
        ge=1,
        description="KV blocks (of the engine's block_size) in the draft model's own pool; default: "
        "max_num_blocks, as many as the target's; a sequence that finds none free gets no proposal that step",
    )
    device: str | None = Field(
        None,
        description="torch device of the draft model; default: the torch executor's `device` when the target "
        "runs on it, 'cuda' under the cuda or triton executor, else 'cpu'",
    )
