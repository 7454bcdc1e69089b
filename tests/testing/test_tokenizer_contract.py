"""TokenizerContract against core's byte and hf tokenizers and the letters tokenizer of docs/hooks.md;
and the kit catching a tokenizer that breaks its decode-purity and thread-safety promises."""

from __future__ import annotations

import re
import threading
import types
from pathlib import Path

import pytest

from hetero_core.default_plugins.byte_tokenizer import ByteTokenizer
from hetero_core.testing import ContractFailure, TokenizerContract

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "hooks.md").read_text(encoding="utf-8")


class TestByteTokenizer(TokenizerContract):
    def make_tokenizer(self):
        return ByteTokenizer()


@pytest.mark.slow
class TestHFTokenizer(TokenizerContract):
    special_tokens = {"<|im_start|>": 1, "<|im_end|>": 2}

    @pytest.fixture(autouse=True)
    def _model_dir(self, smollm2_dir):
        self.model_dir = smollm2_dir

    def make_tokenizer(self):
        from hetero_core.default_plugins.hf_tokenizer import create_hf_tokenizer
        from hetero_core.tokenizer import TokenizerContext

        return create_hf_tokenizer(TokenizerContext(options=None, model_dir=self.model_dir))


def docs_example() -> types.ModuleType:
    source = re.search(r"```python\n(# hetero_tokenizer_letters.py.*?)```", DOCS, flags=re.S).group(1)
    module = types.ModuleType("hetero_tokenizer_letters")
    exec(compile(source, "docs/hooks.md", "exec"), module.__dict__)
    return module


class TestTheDocsLettersTokenizer(TokenizerContract):
    texts = ("hello world", "the quick brown fox", "a", "")

    def make_tokenizer(self):
        return docs_example().LettersTokenizer()


def test_the_docs_example_registers_through_the_hook():
    module = docs_example()
    registered = {}
    module.register_tokenizers(lambda name, factory: registered.update({name: factory}))
    assert registered["letters"](None).encode("Hi there!") == [7, 8, 26, 19, 7, 4, 17, 4]


class StatefulDecode(ByteTokenizer):
    """Breaks decode purity: each call's text depends on the calls before it."""

    def __init__(self):
        self.calls = 0

    def decode(self, token_ids, **kw):
        self.calls += 1
        return super().decode(token_ids, **kw) + ("" if self.calls < 40 else "!")


class SharedBuffer(ByteTokenizer):
    """Breaks thread safety: encode goes through one buffer shared by every thread."""

    def __init__(self):
        self.buffer = []
        self.barrier = threading.Barrier(2, timeout=5)

    def encode(self, text):
        self.buffer.clear()
        for byte in text.encode("utf-8"):
            self.buffer.append(byte)
            if threading.current_thread() is not threading.main_thread() and len(self.buffer) == 3:
                try:
                    self.barrier.wait()  # let the other thread clear the buffer meanwhile
                except threading.BrokenBarrierError:
                    pass
        return list(self.buffer)


def test_the_kit_catches_an_impure_decode():
    class Kit(TokenizerContract):
        def make_tokenizer(self):
            return StatefulDecode()

    with pytest.raises(ContractFailure, match="decode is a pure function"):
        Kit().test_decode_is_pure()


def test_the_kit_catches_a_tokenizer_unsafe_under_threads():
    class Kit(TokenizerContract):
        num_threads = 2
        rounds = 2

        def make_tokenizer(self):
            return SharedBuffer()

    with pytest.raises(ContractFailure, match="from several threads"):
        Kit().test_concurrent_calls_give_what_sequential_calls_give()


def test_the_kit_catches_ids_outside_the_vocabulary():
    class Wide(ByteTokenizer):
        vocab_size = 200  # but encode gives ids up to 255

    class Kit(TokenizerContract):
        texts = ("€",)  # bytes e2 82 ac

        def make_tokenizer(self):
            return Wide()

    with pytest.raises(ContractFailure, match=r"ids are ints in \[0, vocab_size=200\)"):
        Kit().test_encode_gives_ids_in_the_vocabulary_and_decode_round_trips()
