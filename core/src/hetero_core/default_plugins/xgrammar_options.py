"""Options of the built-in xgrammar structured-output backend (section ``[structured_output.xgrammar]``)."""

from pydantic import BaseModel, ConfigDict, Field


class XGrammarOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    any_whitespace: bool = Field(
        False,
        description="let JSON output put any whitespace between tokens (off: compact JSON, which "
        "keeps small models from looping on whitespace)",
    )
    max_threads: int = Field(2, ge=1, description="threads xgrammar may use to compile a grammar")
