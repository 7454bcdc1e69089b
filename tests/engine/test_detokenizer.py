"""Incremental detokenization over the byte tokenizer and a SentencePiece-style tokenizer."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero_core.default_plugins.byte_tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, ByteTokenizer
from hetero_core.engine.requests.detokenizer import MAX_HELD_TOKENS, IncrementalDetokenizer


def stream(tokenizer, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[list[str], str]:
    """Feed ``output_ids`` one by one; return the deltas and the final text (after flush)."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    deltas = [detok.add(t) for t in output_ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.text
    return deltas, detok.text


class CountingTokenizer:
    """Wraps a tokenizer and records the length of every decode call."""

    def __init__(self, inner):
        self.inner = inner
        self.decode_lengths: list[int] = []

    def decode(self, token_ids):
        self.decode_lengths.append(len(token_ids))
        return self.inner.decode(token_ids)


@given(prompt=st.text(max_size=20), output=st.text(max_size=60))
def test_byte_deltas_concatenate_to_the_decode_and_never_show_a_replacement(prompt, output):
    tok = ByteTokenizer()
    output_ids = tok.encode(output)
    deltas, text = stream(tok, tok.encode(prompt), output_ids)
    # A U+FFFD at the very end cannot be told from a cut character: flush drops it.
    assert text == tok.decode(output_ids).rstrip("\ufffd") == output.rstrip("\ufffd")
    assert not any("\ufffd" in d for d in deltas)


def test_multibyte_characters_are_held_until_complete():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, tok.encode("Say: "))
    deltas = [detok.add(b) for b in "你!".encode()]
    assert deltas == ["", "", "你", "!"]
    assert detok.num_held_tokens == 0


def test_special_tokens_add_no_text():
    tok = ByteTokenizer()
    output = [BOS_TOKEN_ID, *tok.encode("hi"), EOS_TOKEN_ID]
    deltas, text = stream(tok, [], output)
    assert text == "hi" and deltas[0] == ""


def test_invalid_utf8_comes_out_as_the_decode_does():
    tok = ByteTokenizer()
    output = [0xE4, 0x41, 0xFF, 0x42]  # a lead byte cut short, a byte that is never valid
    deltas, text = stream(tok, [], output)
    assert text == tok.decode(output) == "\ufffdA\ufffdB"


def test_a_character_cut_by_the_end_of_the_output_is_dropped_by_flush():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, [])
    assert [detok.add(t) for t in [0x61, 0xE4, 0xBD]] == ["a", "", ""]
    assert detok.flush() == ""
    assert detok.text == "a" and detok.flush() == "" and detok.num_held_tokens == 0


class PieceTokenizer:
    """Each token is a byte string; decode joins them (a token may hold a whole and a cut character)."""

    PIECES = {1: b"x\xe4", 2: b"\xbd", 3: b"y"}
    eos_token_id = None
    vocab_size = 4

    def decode(self, token_ids):
        return b"".join(self.PIECES[t] for t in token_ids).decode("utf-8", errors="replace")


def test_flush_keeps_whole_characters_held_with_a_cut_one():
    detok = IncrementalDetokenizer(PieceTokenizer(), [3])
    assert [detok.add(t) for t in [1, 2]] == ["", ""]  # "x" waits with the cut character
    assert detok.flush() == "x" and detok.text == "x"


def test_an_endless_invalid_tail_is_released_after_max_held_tokens():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, [])
    deltas = [detok.add(0xE4) for _ in range(MAX_HELD_TOKENS + 1)]
    assert deltas[:-1] == [""] * MAX_HELD_TOKENS and deltas[-1] == "\ufffd" * (MAX_HELD_TOKENS + 1)
    assert detok.num_held_tokens == 0


def test_decode_calls_stay_short_however_long_the_output():
    counting = CountingTokenizer(ByteTokenizer())
    text = "混合 text, emoji 🚀 and more. " * 100
    output_ids = ByteTokenizer().encode(text)
    _, streamed = stream(counting, ByteTokenizer().encode("prompt " * 50), output_ids)
    assert streamed == text
    assert len(counting.decode_lengths) <= 2 * (len(output_ids) + 1)
    assert max(counting.decode_lengths) <= 8  # context (<= 4 bytes) + held bytes (<= 4)


# A SentencePiece-style tokenizer (Llama's decoder): "▁" marks a space, the decoder strips the
# leading space of a decode call, and byte-fallback tokens spell characters byte by byte.
SP_VOCAB = {
    "<unk>": 0, "<s>": 1, "</s>": 2, "<0xE4>": 3, "<0xBD>": 4, "<0xA0>": 5,
    "▁Hello": 6, "▁world": 7, "!": 8, "▁": 9, "lo": 10, "▁A": 11,
}  # fmt: skip


class SentencePieceLike:
    def __init__(self):
        pytest.importorskip("tokenizers")
        from tokenizers import Tokenizer, decoders, models

        self.tok = Tokenizer(models.BPE(vocab=SP_VOCAB, merges=[], byte_fallback=True, unk_token="<unk>"))
        self.tok.add_special_tokens(["<s>", "</s>"])
        self.tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )

    def decode(self, token_ids):
        return self.tok.decode(list(token_ids), skip_special_tokens=True)


@pytest.mark.parametrize(
    "output, text",
    [
        ([6, 7, 8], " Hello world!"),
        ([6, 3, 4, 5, 7, 2], " Hello你 world"),
        ([10, 9, 6, 1, 7], "lo  Hello world"),
        ([3, 4, 5, 11], "你 A"),
    ],
)
def test_sentencepiece_spaces_merge_with_their_neighbours(output, text):
    tok = SentencePieceLike()
    deltas, streamed = stream(tok, [1, 11], output)  # prompt "<s>▁A"
    assert streamed == text
    assert not any("\ufffd" in d for d in deltas)
    # The one documented difference from decode(output): the first token keeps its leading space.
    assert streamed == tok.decode([11, *output])[len(tok.decode([11])) :]
    assert streamed.lstrip(" ") == tok.decode(output).lstrip(" ")


def test_a_prompt_cut_inside_a_character_keeps_that_character():
    # Documented exception: the character the output completes belongs to the prompt.
    tok = ByteTokenizer()
    _, text = stream(tok, [0xE4], [0xBD, 0xA0, 0x61])
    assert text == "a"
