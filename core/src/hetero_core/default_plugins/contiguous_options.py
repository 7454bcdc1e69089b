"""Options of the built-in ``contiguous`` KV allocator (section ``[kv_allocator.contiguous]``)."""

from pydantic import BaseModel, ConfigDict, Field


class ContiguousAllocatorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_model_len: int | None = Field(
        None,
        ge=1,
        description="tokens reserved per request on its first allocation; default: the engine's "
        "max_model_len (filled in by the builder)",
    )
