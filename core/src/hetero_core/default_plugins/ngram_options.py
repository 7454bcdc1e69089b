"""Options of the built-in n-gram proposer (section ``[speculative_proposer.ngram]``; vLLM's names and
its rule that one given sets the other; the defaults, 2 and 4, are Hetero's: vLLM's are 5 and 5)."""

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NgramOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_lookup_max: int = Field(
        4,
        ge=1,
        le=64,
        description="longest n-gram (the sequence's last n tokens) "
        "looked up earlier in the sequence; the longest that matches wins",
    )
    prompt_lookup_min: int = Field(
        2,
        ge=1,
        le=64,
        description="shortest n-gram looked up (a shorter match "
        "proposes nothing; 1 proposes after any repeated token, mostly wrongly)",
    )

    @model_validator(mode="after")
    def _one_given_sets_both(self) -> "NgramOptions":
        """vLLM's rule: only one of the two given, the other equals it."""
        given = self.model_fields_set
        if "prompt_lookup_max" in given and "prompt_lookup_min" not in given:
            self.prompt_lookup_min = self.prompt_lookup_max
        elif "prompt_lookup_min" in given and "prompt_lookup_max" not in given:
            self.prompt_lookup_max = self.prompt_lookup_min
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                f"({self.prompt_lookup_max}); lower the min or raise the max"
            )
        return self
