"""TokenizerContract: the tests every tokenizer passes, as a mixin its author subclasses.

    from hetero_core.testing import TokenizerContract

    class TestMyTokenizer(TokenizerContract):
        special_tokens = {"<|end|>": 2}  # optional: special texts that encode to one id

        def make_tokenizer(self):
            return MyTokenizer(...)

The rules (a broken one raises ``ContractFailure`` naming it):

- it is a ``hetero_core.tokenizer.Tokenizer``: ``vocab_size`` a positive int, ``eos_token_id`` None or
  an id below it;
- ``encode`` gives a list of ints in ``[0, vocab_size)``, and ``decode(encode(text)) == text`` for every
  sample text (set ``round_trip = False`` for a tokenizer that normalises text; the ids stay checked);
- every id below ``vocab_size`` decodes to a string (all of them up to 4096, else a spread sample);
- ``decode`` leaves the EOS token out (``skip_special_tokens`` defaults to True), and each of
  ``special_tokens`` encodes to its one id, decodes to "" by default and to its text with
  ``skip_special_tokens=False`` (where ``decode`` takes the keyword);
- ``encode_chat`` (where ``chat_template`` is not None) gives ids in the vocabulary whose text holds
  every message's content; with ``chat_template = None`` it raises ``InvalidRequestError``;
- ``decode`` is pure: the same ids give the same text whatever was decoded before, in any order, and
  the ids passed are not changed; the engine's incremental detokenizer, which builds streaming text
  on top of it, gives the text of the whole;
- ``encode``, ``encode_chat`` and ``decode`` called from several threads at once give what they give
  one at a time (``AsyncLLM`` tokenizes in callers' threads while the engine decodes).

Imports neither torch nor pytest.
"""

from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor

from hetero_core.engine.requests.detokenizer import IncrementalDetokenizer
from hetero_core.errors import InvalidRequestError
from hetero_core.testing.contract_failure import ContractFailure
from hetero_core.tokenizer import Tokenizer

__all__ = ["TokenizerContract"]

TEXTS = (
    "The quick brown fox jumps over the lazy dog. It's 3:45pm!",
    "你好，世界！ Grüße, ça va? Ωμέγα",
    "Launch 🚀🔥 done 👍🏽 ok",
    'def f(x: int) -> int:\n    """Square."""\n\treturn x ** 2  # {"a": [1, 2]}\n',
    "  leading and trailing spaces  \n\n",
    "a",
    "",
)
CHAT = (
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "Thanks, bye"},
)
MOST_IDS_CHECKED = 4096


class TokenizerContract:
    """Mix into a test class and define ``make_tokenizer()``."""

    texts: tuple[str, ...] = TEXTS  # sample texts for the round trip, purity and thread checks
    round_trip: bool = True  # decode(encode(text)) == text for every sample text
    special_tokens: dict[str, int] = {}  # special token text -> its id (encodes to exactly that id)
    chat_messages: tuple[dict[str, str], ...] = CHAT
    num_threads: int = 8
    rounds: int = 20  # how many times each thread runs every sample

    def make_tokenizer(self):
        raise NotImplementedError("subclass TokenizerContract and implement make_tokenizer()")

    def checked_tokenizer(self):
        tokenizer = self.make_tokenizer()
        if not isinstance(tokenizer, Tokenizer):
            raise ContractFailure(
                "a tokenizer has eos_token_id, vocab_size, encode, decode and encode_chat",
                f"{type(tokenizer).__name__} lacks some of them",
            )
        return tokenizer

    def encode(self, tokenizer, text: str) -> list[int]:
        ids = tokenizer.encode(text)
        self.check_ids(tokenizer, ids, f"encode({text!r:.60})")
        return ids

    def check_ids(self, tokenizer, ids, what: str) -> None:
        if not isinstance(ids, list):
            raise ContractFailure("encode and encode_chat return a list of ints", f"{what} -> {ids!r:.200}")
        bad = [
            i
            for i in ids
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < tokenizer.vocab_size
        ]
        if bad:
            raise ContractFailure(
                f"token ids are ints in [0, vocab_size={tokenizer.vocab_size})", f"{what}: {bad[:5]}"
            )

    def test_vocab_size_and_eos_token_id(self):
        tokenizer = self.checked_tokenizer()
        size, eos = tokenizer.vocab_size, tokenizer.eos_token_id
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ContractFailure("vocab_size is a positive int", repr(size))
        if eos is not None and (not isinstance(eos, int) or isinstance(eos, bool) or not 0 <= eos < size):
            raise ContractFailure(f"eos_token_id is None or an id in [0, vocab_size={size})", repr(eos))

    def test_encode_gives_ids_in_the_vocabulary_and_decode_round_trips(self):
        tokenizer = self.checked_tokenizer()
        for text in self.texts:
            ids = self.encode(tokenizer, text)
            decoded = tokenizer.decode(ids)
            if not isinstance(decoded, str):
                raise ContractFailure("decode returns a str", f"decode({ids[:10]}...) -> {decoded!r:.100}")
            if self.round_trip and decoded != text:
                raise ContractFailure(
                    "decode(encode(text)) == text (set round_trip = False for a tokenizer that normalises)",
                    f"{text!r:.80} -> {decoded!r:.80}",
                )

    def test_every_id_in_the_vocabulary_decodes(self):
        tokenizer = self.checked_tokenizer()
        size = tokenizer.vocab_size
        step = max(1, size // MOST_IDS_CHECKED)
        for token_id in sorted({*range(0, size, step), size - 1}):
            try:
                text = tokenizer.decode([token_id])
            except Exception as exc:  # noqa: BLE001 - any exception breaks the rule; report it
                raise ContractFailure(
                    "every id below vocab_size decodes", f"decode([{token_id}]) raised {exc!r}"
                ) from exc
            if not isinstance(text, str):
                raise ContractFailure("decode returns a str", f"decode([{token_id}]) -> {text!r:.100}")

    def test_decode_leaves_special_tokens_out_by_default(self):
        tokenizer = self.checked_tokenizer()
        ids = self.encode(tokenizer, self.texts[0])
        eos = tokenizer.eos_token_id
        if eos is not None and tokenizer.decode([*ids, eos]) != tokenizer.decode(ids):
            raise ContractFailure(
                "decode leaves the EOS token out (skip_special_tokens defaults to True)",
                f"decode(ids + [{eos}]) = {tokenizer.decode([*ids, eos])!r:.100}",
            )
        keyword = "skip_special_tokens" in inspect.signature(tokenizer.decode).parameters
        for text, token_id in self.special_tokens.items():
            if tokenizer.encode(text) != [token_id]:
                raise ContractFailure(
                    "a special token's text encodes to its one id",
                    f"encode({text!r}) = {tokenizer.encode(text)}, expected [{token_id}]",
                )
            if tokenizer.decode([token_id]) != "":
                raise ContractFailure(
                    "decode leaves special tokens out by default",
                    f"decode([{token_id}]) = {tokenizer.decode([token_id])!r}",
                )
            if keyword and tokenizer.decode([token_id], skip_special_tokens=False) != text:
                raise ContractFailure(
                    "decode(ids, skip_special_tokens=False) shows a special token as its text",
                    f"{token_id} -> {tokenizer.decode([token_id], skip_special_tokens=False)!r}",
                )

    def test_encode_chat_holds_every_message(self):
        tokenizer = self.checked_tokenizer()
        messages = [dict(m) for m in self.chat_messages]
        if getattr(tokenizer, "chat_template", "") is None:
            try:
                tokenizer.encode_chat(messages)
            except InvalidRequestError:
                return
            raise ContractFailure(
                "encode_chat raises InvalidRequestError without a chat template",
                "it returned ids although chat_template is None",
            )
        ids = tokenizer.encode_chat(messages)
        self.check_ids(tokenizer, ids, "encode_chat(messages)")
        keyword = "skip_special_tokens" in inspect.signature(tokenizer.decode).parameters
        text = tokenizer.decode(ids, skip_special_tokens=False) if keyword else tokenizer.decode(ids)
        missing = [m["content"] for m in messages if m["content"] not in text]
        if missing:
            raise ContractFailure(
                "encode_chat's ids hold every message's content", f"{missing} not in {text!r:.200}"
            )
        if messages != [dict(m) for m in self.chat_messages]:
            raise ContractFailure("encode_chat leaves its messages unchanged", repr(messages)[:200])

    def test_decode_is_pure(self):
        tokenizer = self.checked_tokenizer()
        all_ids = [self.encode(tokenizer, text) for text in self.texts]
        first = [tokenizer.decode(ids) for ids in all_ids]
        prefixes = [(ids[:n], tokenizer.decode(ids[:n])) for ids in all_ids for n in range(len(ids) + 1)]
        for ids, text in reversed(prefixes):  # the same ids, after other ids, in the other order
            again = tokenizer.decode(tuple(ids))
            if again != text:
                raise ContractFailure(
                    "decode is a pure function of its ids (no state between calls)",
                    f"{ids[:10]}: {text!r:.60} then {again!r:.60}",
                )
        for ids, text in zip(all_ids, first):
            passed = list(ids)
            tokenizer.decode(passed)
            if passed != ids:
                raise ContractFailure(
                    "decode leaves the ids it is given unchanged", f"{ids[:10]} -> {passed[:10]}"
                )
            streamed = streaming_text(tokenizer, ids)
            if streamed != text:
                raise ContractFailure(
                    "the engine's incremental detokenizer over decode gives decode's text",
                    f"{ids[:10]}: streamed {streamed!r:.60}, decode {text!r:.60}",
                )

    def test_concurrent_calls_give_what_sequential_calls_give(self):
        tokenizer = self.checked_tokenizer()
        has_chat = getattr(tokenizer, "chat_template", "") is not None
        messages = [dict(m) for m in self.chat_messages]

        def work() -> list:
            results = []
            for _ in range(self.rounds):
                for text in self.texts:
                    ids = tokenizer.encode(text)
                    results.append((ids, tokenizer.decode(ids)))
                if has_chat:
                    results.append(tokenizer.encode_chat(messages))
            return results

        expected = work()
        with ThreadPoolExecutor(self.num_threads) as pool:
            outcomes = [f.result() for f in [pool.submit(work) for _ in range(self.num_threads)]]
        for thread, outcome in enumerate(outcomes):
            if outcome != expected:
                wrong = next(i for i, (a, b) in enumerate(zip(outcome, expected)) if a != b)
                raise ContractFailure(
                    "encode, encode_chat and decode from several threads give what they give one at a time",
                    f"thread {thread}, call {wrong}: {outcome[wrong]!r:.150}",
                )


def streaming_text(tokenizer, ids: list[int]) -> str:
    """The text the engine streams for ``ids`` generated after an empty prompt."""
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    return "".join(detokenizer.add(token_id) for token_id in ids) + detokenizer.flush()
