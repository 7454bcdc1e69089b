"""Options of the built-in n-gram proposer (section ``[speculative_proposer.ngram]``; vLLM's names)."""

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NgramOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_lookup_max: int = Field(4, ge=1, le=64, description="longest n-gram (the sequence's last n tokens) "
                                   "looked up earlier in the sequence; the longest that matches wins")
    prompt_lookup_min: int = Field(1, ge=1, le=64, description="shortest n-gram looked up (a shorter match "
                                   "proposes nothing)")

    @model_validator(mode="after")
    def _min_not_above_max(self) -> "NgramOptions":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            if "prompt_lookup_min" not in self.model_fields_set:  # only the max was given: vLLM's rule
                self.prompt_lookup_min = self.prompt_lookup_max
            else:
                raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                                 f"({self.prompt_lookup_max}); lower the min or raise the max")
        return self
