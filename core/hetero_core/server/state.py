"""What every route needs: the AsyncLLM, the served model's name and the request defaults."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field, replace

from fastapi import Request

from hetero_core.async_llm import AsyncLLM
from hetero_core.engine.params import SamplingParams
from hetero_core.server.errors import APIError
from hetero_core.server.generation import ChoiceSpec
from hetero_core.server.protocol import SamplingFields


@dataclass
class ServerState:
    llm: AsyncLLM
    model_name: str
    max_model_len: int
    default_params: SamplingParams
    api_key: str | None = None
    _ids: itertools.count = field(default_factory=itertools.count)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"model {name!r} does not exist; available: {self.model_name}",
                           param="model", code="model_not_found")

    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}{next(self._ids)}"

    def choice_specs(self, body: SamplingFields, prompts: list, max_tokens: int | None,
                     logprobs: int | None) -> list[ChoiceSpec]:
        """``n`` choices per prompt; choice i > 0 of a seeded request gets seed + i (distinct, reproducible)."""
        base = self.sampling_params(body, max_tokens, logprobs)
        specs = []
        for prompt in prompts:
            for i in range(body.n):
                params = replace(base, seed=base.seed + i) if i and base.seed is not None else base
                specs.append(ChoiceSpec(prompt, params, fit_max_tokens=max_tokens is None))
        return specs

    def sampling_params(self, body: SamplingFields, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        d = self.default_params
        return SamplingParams(
            temperature=d.temperature if body.temperature is None else body.temperature,
            top_p=d.top_p if body.top_p is None else body.top_p,
            top_k=d.top_k if body.top_k is None else body.top_k,
            min_p=d.min_p if body.min_p is None else body.min_p,
            repetition_penalty=d.repetition_penalty if body.repetition_penalty is None else body.repetition_penalty,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            max_tokens=d.max_tokens if max_tokens is None else max_tokens,
            stop=tuple(body.stop or ()),
            ignore_eos=body.ignore_eos,
            logprobs=logprobs,
            seed=d.seed if body.seed is None else body.seed,
        )


def get_state(request: Request) -> ServerState:
    return request.app.state.hetero
