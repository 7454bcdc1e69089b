"""The base of every request body model: strict types, finite numbers, unknown fields ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RequestModel(BaseModel):
    """A request body or a part of one: strict types, finite numbers, unknown fields ignored."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
