"""The ``xgrammar`` structured-output backend: JSON schema, JSON object, regex, choice and EBNF grammars
compiled by xgrammar (https://github.com/mlc-ai/xgrammar, vLLM's default), one matcher per request.

Needs ``pip install 'hetero-core[structured]'``; without it the first guided request gets one line
saying so. The tokenizer's vocabulary comes from an hf tokenizer (``backend_tokenizer``) or a
tokenizer that lists its ids' bytes (``grammar_vocab()``, as the byte tokenizer does).
"""

from __future__ import annotations

import importlib.util

from hetero_core.errors import InvalidRequestError, MissingDependencyError
from hetero_core.structured_output import GuidedDecodingParams, StructuredOutputContext

INSTALL = "pip install 'hetero-core[structured]'"


def missing_xgrammar() -> list[str]:
    """Why this backend cannot run here (empty when xgrammar is installed)."""
    if importlib.util.find_spec("xgrammar") is None:
        return [f"xgrammar (core's structured-output backend) is not installed; run: {INSTALL}"]
    return []


class XGrammarState:
    """One request's xgrammar ``GrammarMatcher``."""

    def __init__(self, matcher) -> None:
        self._matcher = matcher

    def fill_bitmask(self, bitmask, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        return self._matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()


class XGrammarBackend:
    def __init__(self, ctx: StructuredOutputContext) -> None:
        reasons = missing_xgrammar()
        if reasons:
            raise MissingDependencyError(reasons[0])
        import xgrammar

        self._xgr = xgrammar
        self.options = ctx.options
        info = _tokenizer_info(xgrammar, ctx.tokenizer, ctx.vocab_size)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=ctx.options.max_threads)

    def compile(self, params: GuidedDecodingParams):
        compiler, kind = self._compiler, params.kind
        if params.whitespace_pattern is not None:
            raise InvalidRequestError(
                "guided_decoding whitespace_pattern is not supported by xgrammar: leave it None (JSON is "
                "compact; the option [structured_output.xgrammar] any_whitespace = true allows any "
                "whitespace)"
            )
        try:
            if kind in ("json", "json_object"):  # json_object: OpenAI's JSON mode asks for an object
                schema = params.json if kind == "json" else '{"type": "object"}'
                grammar = self._xgr.Grammar.from_json_schema(
                    schema, any_whitespace=self.options.any_whitespace
                )
                return compiler.compile_grammar(_without_control_characters(str(grammar)))
            if kind == "regex":
                return compiler.compile_regex(params.regex)
            if kind == "choice":
                return compiler.compile_regex("|".join(_regex_literal(c) for c in params.choice))
            return compiler.compile_grammar(params.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InvalidRequestError(
                f"guided {kind} could not be compiled by xgrammar: {first_line}"
            ) from None

    def new_state(self, compiled) -> XGrammarState:
        return XGrammarState(self._xgr.GrammarMatcher(compiled))


def create_xgrammar_backend(ctx: StructuredOutputContext) -> XGrammarBackend:
    return XGrammarBackend(ctx)


def _tokenizer_info(xgr, tokenizer, vocab_size: int):
    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast(tokenizer_object=backend)
        return xgr.TokenizerInfo.from_huggingface(fast, vocab_size=vocab_size, stop_token_ids=stop)
    grammar_vocab = getattr(tokenizer, "grammar_vocab", None)
    if grammar_vocab is None:
        raise MissingDependencyError(
            f"the xgrammar backend cannot read the vocabulary of tokenizer {type(tokenizer).__name__}: "
            "it needs backend_tokenizer (a tokenizers.Tokenizer) or grammar_vocab() (bytes per id)"
        )
    return xgr.TokenizerInfo(
        grammar_vocab(), vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stop
    )


# xgrammar 0.2.8 writes the characters of a length-bounded JSON string as ``[^"\\\r\n]``, which
# lets raw control characters (U+0000-U+001F, invalid in JSON strings) through; its unbounded
# strings exclude them. Found by the StructuredOutputContract kit.
_LOOSE_STRING_CHARACTER = r"[^\"\\\r\n]"
_JSON_STRING_CHARACTER = r"[^\0-\x1f\"\\]"


def _without_control_characters(ebnf: str) -> str:
    return ebnf.replace(_LOOSE_STRING_CHARACTER, _JSON_STRING_CHARACTER)


def _regex_literal(text: str) -> str:
    """``text`` as a regex that matches it literally."""
    return "".join("\\" + c if c in r"\^$.|?*+()[]{}/" else c for c in text)


__all__ = ["XGrammarBackend", "create_xgrammar_backend", "missing_xgrammar"]
