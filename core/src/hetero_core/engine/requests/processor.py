"""RequestProcessor: what a caller sends, checked and tokenized into an ``EngineRequest``.

The work here grows with the input (tokenizing a long prompt), so it runs in the caller's thread
before the engine sees the request: ``Engine.add_request`` for a synchronous caller, a worker
thread for ``AsyncLLM``, whose loop thread then only admits already-tokenized requests. It reads
only the tokenizer and fixed limits, so several threads may use it at once.

The order puts what is cheap first: the sampling parameters, priority and tenant; the prompt's
shape; a size bound that needs no tokenizer (more token ids than ``max_model_len``, or a text of
more characters than ``max_model_len`` times the most characters one token can stand for: it can
never fit); only then the tokenizer, and the request's grammar: compiled here, and refused when its
token constraints leave it no first token (``sampling/grammar_start``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.requests.params_tokens import resolve_token_params
from hetero_core.engine.requests.prompts import (
    check_prompt_size,
    decode_prompt,
    tokenize_prompt,
    unwrap_prompt,
)
from hetero_core.engine.requests.sequence import check_priority_and_tenant
from hetero_core.engine.sampling.prompt_logprobs import check_prompt_logprobs
from hetero_core.errors import InvalidRequestError

__all__ = ["CheckedRequest", "EngineRequest", "RequestProcessor"]


@dataclass(frozen=True)
class CheckedRequest:
    """A request whose parameters and prompt shape are valid; its prompt is not tokenized yet."""

    prompt: object  # text, token ids or chat messages (a vLLM prompt dict is unwrapped)
    params: SamplingParams
    priority: int = 0
    tenant: str | None = None


@dataclass(frozen=True)
class EngineRequest:
    """A request ready for the engine: its prompt as token ids (and as text, for its outputs)."""

    prompt: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    priority: int = 0
    tenant: str | None = None
    grammar: Any = None  # the compiled grammar of params.guided_decoding (engine.structured_output)
    kv_transfer: Any = (
        None  # a KVHandoff: the prompt's K/V and first token from a prefill engine (kv_transfer.py)
    )
    export_kv: bool = False  # the final output carries the prompt's KV blocks (RequestOutput.kv_blocks)


class RequestProcessor:
    """Checks and tokenizes requests for one engine; safe to call from several threads at once."""

    def __init__(
        self, tokenizer, max_model_len: int, default_params: SamplingParams, structured_output=None
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.default_params = default_params
        self.structured_output = structured_output  # engine.structured_output.StructuredOutput, or None
        self.prompt_logprobs_refusal: str | None = None  # why the executor cannot give prompt logprobs

    def process(self, prompt, params=None, *, priority: int = 0, tenant: str | None = None) -> EngineRequest:
        """``check`` then ``tokenize``; raises InvalidRequestError naming the problem."""
        return self.tokenize(self.check(prompt, params, priority=priority, tenant=tenant))

    def check(self, prompt, params=None, *, priority: int = 0, tenant: str | None = None) -> CheckedRequest:
        """Everything that needs no tokenizer: parameters, priority, tenant, the prompt's shape and size."""
        if isinstance(prompt, EngineRequest):
            raise InvalidRequestError("an EngineRequest is already processed; pass it to add_request as is")
        resolved = self.resolve_params(params)
        check_prompt_logprobs(resolved, self.prompt_logprobs_refusal)
        check_priority_and_tenant(priority, tenant)
        prompt = unwrap_prompt(prompt)
        check_prompt_size(
            prompt, self.max_model_len, lambda: getattr(self.tokenizer, "max_token_chars", None)
        )
        return CheckedRequest(prompt, resolved, priority, tenant)

    def tokenize(self, request: CheckedRequest) -> EngineRequest:
        """The prompt's token ids (the work that grows with the prompt, bounded by ``check``)."""
        token_ids = tokenize_prompt(self.tokenizer, request.prompt)
        text = request.prompt if isinstance(request.prompt, str) else decode_prompt(self.tokenizer, token_ids)
        params = resolve_token_params(request.params, self.tokenizer)
        return EngineRequest(
            text, tuple(token_ids), params, request.priority, request.tenant, self._compile(params)
        )

    def _compile(self, params: SamplingParams):
        """The request's compiled grammar (None without ``guided_decoding``)."""
        if params.guided_decoding is None:
            return None
        if self.structured_output is None:
            raise InvalidRequestError(
                "guided decoding is not available: this engine has no structured-output backend"
            )
        compiled = self.structured_output.compile(params.guided_decoding)
        if params.has_token_constraints:
            self._check_grammar_start(compiled, params)
        return compiled

    def _check_grammar_start(self, compiled, params: SamplingParams) -> None:
        """Refuse a request whose token constraints leave its grammar no first token (``grammar_start``)."""
        from hetero_core.engine.sampling.grammar_start import grammar_start_error

        state = self.structured_output.new_state(compiled)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        reason = grammar_start_error(state, params, self.structured_output.vocab_size, eos)
        if reason is not None:
            raise InvalidRequestError(reason)

    def resolve_params(self, params) -> SamplingParams:
        """SamplingParams as given; a dict of their fields over the engine's defaults; None: the defaults."""
        if params is None:
            return self.default_params
        if isinstance(params, SamplingParams):
            return params
        if isinstance(params, dict):
            SamplingParams.from_dict(params)  # unknown keys are named against the given dict
            return SamplingParams.from_dict({**asdict(self.default_params), **params})
        raise InvalidRequestError(
            f"sampling parameters must be a SamplingParams or a dict, got {type(params).__name__}"
        )
