"""The hf tokenizer's max_token_chars: a bound only where no step of the pipeline can drop text."""

from __future__ import annotations

import pytest

from hetero_core.default_plugins.hf_token_bound import max_token_chars

BPE = {"type": "BPE", "fuse_unk": False, "byte_fallback": False}
VOCAB = ["a", "hello", "Ġworld", "<|im_start|>"]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": BPE}, 12),
        (
            {
                "normalizer": {
                    "type": "Sequence",
                    "normalizers": [
                        {"type": "Prepend", "prepend": "▁"},
                        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                    ],
                },
                "pre_tokenizer": None,
                "model": {**BPE, "fuse_unk": True, "byte_fallback": True},
            },
            12,
        ),  # Llama 2
        (
            {
                "normalizer": None,
                "pre_tokenizer": {
                    "type": "Sequence",
                    "pretokenizers": [{"type": "Split", "behavior": "Isolated"}, {"type": "ByteLevel"}],
                },
                "model": BPE,
            },
            12,
        ),  # Llama 3
        # Text can disappear or merge into one token: no bound is claimed.
        ({"normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "model": BPE}, None),
        ({"normalizer": None, "pre_tokenizer": {"type": "Split", "behavior": "Removed"}, "model": BPE}, None),
        (
            {
                "normalizer": {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
                "pre_tokenizer": None,
                "model": BPE,
            },
            None,
        ),
        ({"normalizer": {"type": "NFKC"}, "pre_tokenizer": None, "model": BPE}, None),
        ({"normalizer": None, "pre_tokenizer": None, "model": {**BPE, "fuse_unk": True}}, None),
        ({"normalizer": None, "pre_tokenizer": None, "model": {"type": "WordPiece"}}, None),
        ({"normalizer": None, "pre_tokenizer": None, "model": {"type": "Unigram"}}, None),
    ],
)
def test_the_bound_holds_only_for_pipelines_that_keep_all_text(spec, expected):
    assert max_token_chars(spec, VOCAB) == expected


@pytest.mark.slow
def test_the_embedded_model_refuses_a_huge_prompt_without_tokenizing(smollm2_dir):
    from hetero_core.default_plugins.hf_tokenizer import HFTokenizer
    from hetero_core.engine.requests.params import SamplingParams
    from hetero_core.engine.requests.processor import RequestProcessor
    from hetero_core.errors import InvalidRequestError

    tokenizer = HFTokenizer(smollm2_dir)
    assert tokenizer.max_token_chars == 81  # a run of 80 '#' and the Ġ-spaces token
    text = "The capital of France is Paris. " * 200  # long enough for the GIL-free path
    assert tokenizer.encode(text) == tokenizer._tokenizer.encode(text).ids
    processor = RequestProcessor(tokenizer, 2048, SamplingParams())
    with pytest.raises(InvalidRequestError, match="refused without tokenizing"):
        processor.check("x" * (2048 * 81), SamplingParams(max_tokens=4))
    assert processor.check("x" * 2048 * 80, SamplingParams(max_tokens=4))  # might fit: tokenize to know
