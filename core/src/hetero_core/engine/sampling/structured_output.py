"""Structured output in the engine: the backend protocol, and the per-engine manager that compiles a
request's grammar, fills the step's token bitmask and advances each request's grammar by its token.

A backend (a plugin of the ``structured_output`` seam, ``hetero_core.structured_output``) compiles
``GuidedDecodingParams`` into an immutable grammar, shareable between requests, and makes one
``GrammarState`` per request (its position in the grammar). Per step, for the rows that sample, the
engine asks each constrained request's state to fill its row of one int32 bitmask
(``token_bitmask``); the bitmask travels in the batch (an executor that picks tokens itself honours
it) and the sampler sets forbidden tokens to -inf. After sampling, each state accepts its token; a
state that has reached the end of its grammar ends the request (finish reason ``stop``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from hetero_core.engine.requests.guided import GuidedDecodingParams
from hetero_core.engine.sampling.token_bitmask import allocate_token_bitmask
from hetero_core.errors import HeteroError, InvalidRequestError

MAX_CACHED_GRAMMARS = 256


@runtime_checkable
class GrammarState(Protocol):
    """One request's position in its grammar."""

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        """Write the tokens allowed next into row ``row`` of ``bitmask`` (``token_bitmask`` layout)."""
        ...

    def accept_token(self, token_id: int) -> bool:
        """Advance by ``token_id``; False (and no change) if the grammar does not allow it."""
        ...

    def is_terminated(self) -> bool:
        """Whether the grammar is complete and has accepted its stop token."""
        ...


@runtime_checkable
class StructuredOutputBackend(Protocol):
    """Compiles guided-decoding requests for one tokenizer and vocabulary."""

    def compile(self, params: GuidedDecodingParams) -> Any:
        """An immutable compiled grammar; raise InvalidRequestError for a schema, regex or grammar it
        cannot take."""
        ...

    def new_state(self, compiled: Any) -> GrammarState:
        """A fresh state (at the start) of a grammar ``compile`` returned."""
        ...


@dataclass(frozen=True)
class StructuredOutputContext:
    """What a structured-output backend factory receives."""

    options: Any  # the plugin's validated options model instance, or None
    tokenizer: Any  # the engine's tokenizer (hetero_core.tokenizer.Tokenizer)
    vocab_size: int  # the width of the model's logits (>= the tokenizer's vocabulary)


class StructuredOutput:
    """The engine's structured output: a backend made on first use, its compiled grammars cached.

    ``compile`` runs in callers' threads (``RequestProcessor``); the rest in the engine's thread.
    """

    def __init__(
        self, create_backend: Callable[[], StructuredOutputBackend] | None, vocab_size: int, name: str = ""
    ) -> None:
        self._create_backend = create_backend
        self._backend: StructuredOutputBackend | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[GuidedDecodingParams, Any] = OrderedDict()
        self.vocab_size = vocab_size
        self.name = name

    @property
    def backend(self) -> StructuredOutputBackend:
        with self._lock:
            if self._backend is None:
                if self._create_backend is None:
                    raise InvalidRequestError("this engine has no structured-output backend")
                try:
                    self._backend = self._create_backend()
                except HeteroError as exc:
                    raise InvalidRequestError(f"structured output is unavailable: {exc}") from None
            return self._backend

    def compile(self, params: GuidedDecodingParams) -> Any:
        """The compiled grammar for ``params`` (cached); InvalidRequestError if it cannot be compiled, or
        if it names another backend (vLLM's per-request ``backend``: here the setting chooses)."""
        asked = params.backend
        if asked is not None and asked != "auto" and asked.split(":")[0] != self.name:
            raise InvalidRequestError(
                f"guided_decoding backend {asked!r} is not this engine's: it uses {self.name!r} (the "
                "structured_output setting chooses it for every request); leave backend None, 'auto' or "
                f"{self.name!r}"
            )
        with self._lock:
            if params in self._cache:
                self._cache.move_to_end(params)
                return self._cache[params]
        backend = self.backend
        try:
            compiled = backend.compile(params)
        except InvalidRequestError:
            raise
        except Exception as exc:  # a backend's own error for a bad schema or regex fails the request alone
            raise InvalidRequestError(f"guided {params.kind} could not be compiled: {exc}") from None
        with self._lock:
            self._cache[params] = compiled
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return compiled

    def new_state(self, compiled: Any) -> GrammarState:
        return self.backend.new_state(compiled)

    def bitmask(self, states: list[GrammarState | None]):
        """The step's bitmask, one row per sampled row (rows without a grammar allow everything), or
        None when no row is constrained."""
        if all(state is None for state in states):
            return None
        bitmask = allocate_token_bitmask(len(states), self.vocab_size)
        for row, state in enumerate(states):
            if state is not None:
                state.fill_bitmask(bitmask, row)
        return bitmask
