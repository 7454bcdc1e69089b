"""Options of the mock executors (settings sections ``[executor.mock]`` and ``[executor.null]``)."""

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TokenRangeOptions(BaseModel):
    """The range the mock executors draw tokens from (shared by ``mock`` and ``null``)."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(127, ge=1, description="tokens are drawn from [first_token_id, vocab_size)")
    first_token_id: int = Field(32, ge=0, description="lowest token id drawn (32: printable ASCII)")

    @model_validator(mode="after")
    def _range_not_empty(self):
        if self.first_token_id >= self.vocab_size:
            raise ValueError(
                f"first_token_id ({self.first_token_id}) must be below vocab_size ({self.vocab_size})"
            )
        return self


class MockExecutorOptions(TokenRangeOptions):
    """Options of the mock executor (settings section ``[executor.mock]``)."""

    seed: int = Field(0, description="mixed into every token; changes all outputs")
    eos_after: int | None = Field(None, ge=1, description="emit EOS as the N-th output token")
    eos_probability: float = Field(0.0, ge=0, le=1, description="chance of EOS at each seeded position")
    prefill_latency_per_token: float = Field(0.0, ge=0, description="simulated seconds per prefill token")
    decode_latency_per_step: float = Field(0.0, ge=0, description="simulated seconds per step with decodes")


class NullExecutorOptions(TokenRangeOptions):
    """Options of the null executor (settings section ``[executor.null]``)."""

    step_time: float = Field(0.0, ge=0, description="simulated device seconds per step, slept (0: none)")
