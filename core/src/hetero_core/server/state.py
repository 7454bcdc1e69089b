"""What every route needs: the AsyncLLM, the served model's name, the request defaults, the choice budget."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

from fastapi import Request

from hetero_core.async_llm import AsyncLLM
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.openai_api.convert import choice_params, sampling_params
from hetero_core.openai_api.protocol import SamplingFields
from hetero_core.server.choices import ChoiceBudget
from hetero_core.server.errors import APIError
from hetero_core.server.generation import ChoiceSpec


@dataclass
class ServerState:
    llm: AsyncLLM
    model_name: str
    max_model_len: int
    default_params: SamplingParams
    choices: ChoiceBudget
    _ids: itertools.count = field(default_factory=itertools.count)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"model {name!r} does not exist; available: {self.model_name}",
                param="model",
                code="model_not_found",
            )

    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}{next(self._ids)}"

    def choice_specs(
        self,
        body: SamplingFields,
        prompts: list,
        max_tokens: int | None,
        logprobs: int | None,
        num_per_prompt: int | None = None,
    ) -> list[ChoiceSpec]:
        """``num_per_prompt`` (default ``n``) choices per prompt; choice i > 0 of a seeded request gets
        seed + i (distinct, reproducible)."""
        base = self.sampling_params(body, max_tokens, logprobs)
        return [
            ChoiceSpec(prompt, choice_params(base, i), fit_max_tokens=max_tokens is None)
            for prompt in prompts
            for i in range(num_per_prompt or body.n)
        ]

    def sampling_params(
        self, body: SamplingFields, max_tokens: int | None, logprobs: int | None
    ) -> SamplingParams:
        return sampling_params(body, self.default_params, max_tokens, logprobs)


def get_state(request: Request) -> ServerState:
    return request.app.state.hetero
