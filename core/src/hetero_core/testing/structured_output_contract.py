"""StructuredOutputContract: the tests every structured-output backend passes, as a mixin its author
subclasses.

    from hetero_core.testing import StructuredOutputContract

    class TestMyBackend(StructuredOutputContract):
        def make_backend(self, ctx):
            return MyBackend(ctx)

Each test plays the engine's part on the byte tokenizer (override ``make_tokenizer`` for another):
compile through core's ``StructuredOutput`` (which caches and turns a backend's own errors into
``InvalidRequestError``), then, token by token, fill a bitmask row, pick one allowed token (seeded,
preferring EOS once allowed, as the mock executor does) and accept it, until the grammar terminates.
The rules (a broken one raises ``ContractFailure``):

- the text a walk ends with parses as JSON and matches its schema (``structured_output_cases.SCHEMAS``),
  fully matches its regex, or is one of its choices; ``json_object`` gives a JSON object;
- a walk terminates within ``max_tokens`` and every row allows at least one token until it does;
- a token the mask forbids is refused by ``accept_token`` (which then changes nothing);
- a schema the backend cannot take is an ``InvalidRequestError`` naming the request, not a crash.

Imports neither torch (until a test runs) nor pytest.
"""

from __future__ import annotations

import json
import random
import re

from hetero_core.engine.requests.guided import GuidedDecodingParams
from hetero_core.engine.sampling.structured_output import StructuredOutput, StructuredOutputContext
from hetero_core.engine.sampling.token_bitmask import allowed_token_ids
from hetero_core.errors import InvalidRequestError
from hetero_core.testing.contract_failure import ContractFailure
from hetero_core.testing.structured_output_cases import CHOICES, REGEXES, SCHEMAS, schema_problems

__all__ = ["StructuredOutputContract"]


class StructuredOutputContract:
    """Mix into a test class and define ``make_backend(ctx)`` (ctx: ``StructuredOutputContext``)."""

    max_tokens: int = 4000
    seeds: tuple[int, ...] = (0, 1, 2)
    options = None  # the context's options (your options model instance), if your backend needs them

    def make_backend(self, ctx: StructuredOutputContext):
        raise NotImplementedError("subclass StructuredOutputContract and implement make_backend(ctx)")

    def make_tokenizer(self):
        from hetero_core.default_plugins.byte_tokenizer import ByteTokenizer

        return ByteTokenizer()

    def structured_output(self) -> StructuredOutput:
        tokenizer = self.make_tokenizer()
        ctx = StructuredOutputContext(self.options, tokenizer, tokenizer.vocab_size)
        so = StructuredOutput(lambda: self.make_backend(ctx), tokenizer.vocab_size)
        so.tokenizer = tokenizer
        return so

    def walk(self, so: StructuredOutput, params: GuidedDecodingParams, seed: int) -> str:
        """The text of one constrained walk (what the engine would produce with a random model)."""
        state, rng, tokens = so.new_state(so.compile(params)), random.Random(seed), []
        eos = so.tokenizer.eos_token_id
        for _ in range(self.max_tokens):
            bitmask = so.bitmask([state])
            allowed = allowed_token_ids(bitmask[0], so.vocab_size)
            if not allowed:
                raise ContractFailure(
                    "a live grammar allows at least one token", f"{params.kind} after {tokens}"
                )
            token = eos if eos in allowed else rng.choice(allowed)
            if not state.accept_token(token):
                raise ContractFailure("accept_token takes every token the mask allows", f"token {token}")
            if token == eos or state.is_terminated():
                return so.tokenizer.decode(tokens)
            tokens.append(token)
        raise ContractFailure(
            "a walk terminates within max_tokens", f"{params.kind}: {so.tokenizer.decode(tokens)[:80]!r}"
        )

    def test_json_schemas(self):
        so = self.structured_output()
        for name, schema in SCHEMAS.items():
            for seed in self.seeds:
                text = self.walk(so, GuidedDecodingParams(json=schema), seed)
                try:
                    value = json.loads(text)
                except ValueError as exc:
                    raise ContractFailure("guided json output parses", f"{name}: {exc}: {text!r}") from None
                problems = schema_problems(value, schema)
                if problems:
                    raise ContractFailure(
                        "guided json output matches its schema", f"{name}: {problems} in {text!r}"
                    )

    def test_json_object(self):
        so = self.structured_output()
        for seed in self.seeds:
            text = self.walk(so, GuidedDecodingParams(json_object=True), seed)
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ContractFailure("json_object output parses", f"{exc}: {text!r}") from None
            if not isinstance(value, dict):
                raise ContractFailure("json_object output is an object", repr(text))

    def test_regexes_and_choices(self):
        so = self.structured_output()
        for name, pattern in REGEXES.items():
            for seed in self.seeds:
                text = self.walk(so, GuidedDecodingParams(regex=pattern), seed)
                if re.fullmatch(pattern, text) is None:
                    raise ContractFailure("guided regex output matches the regex", f"{name}: {text!r}")
        for name, choice in CHOICES.items():
            for seed in self.seeds:
                text = self.walk(so, GuidedDecodingParams(choice=choice), seed)
                if text not in choice:
                    raise ContractFailure("guided choice output is one of the choices", f"{name}: {text!r}")

    def test_a_forbidden_token_is_refused(self):
        so = self.structured_output()
        state = so.new_state(so.compile(GuidedDecodingParams(choice=["yes", "no"])))
        allowed = set(allowed_token_ids(so.bitmask([state])[0], so.vocab_size))
        forbidden = next(t for t in range(so.vocab_size) if t not in allowed)
        if state.accept_token(forbidden):
            raise ContractFailure("accept_token refuses a token the mask forbids", f"token {forbidden}")
        if set(allowed_token_ids(so.bitmask([state])[0], so.vocab_size)) != allowed:
            raise ContractFailure("a refused token leaves the state as it was", f"token {forbidden}")

    def test_a_bad_schema_is_an_invalid_request(self):
        so = self.structured_output()
        for params in (
            GuidedDecodingParams(json={"type": "no-such-type"}),
            GuidedDecodingParams(regex="(unclosed"),
        ):
            try:
                so.compile(params)
            except InvalidRequestError:
                continue
            raise ContractFailure(
                "a schema or regex the backend cannot take is an InvalidRequestError", params.spec
            )
