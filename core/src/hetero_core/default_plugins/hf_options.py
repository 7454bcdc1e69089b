"""Options of the built-in Hugging Face tokenizer (section ``[tokenizer.hf]``); light import."""

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class HFTokenizerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chat_template: Path | None = Field(
        None, description="a Jinja chat template file that replaces the model's own"
    )
    add_special_tokens: bool = Field(
        True, description="add the tokenizer's special tokens (e.g. BOS) when encoding plain text"
    )
