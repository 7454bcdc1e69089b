"""A converted GGUF stops where llama.cpp stops: its generation_config.json lists llama.cpp's
end-of-generation tokens (the EOS first), the hf tokenizer keeps the EOS and makes the others its stop
ids, and the engine adds those to every request's stop ids unless ``ignore_eos``.

The expected sets are what llama.cpp's loader prints for these files ("printing all EOG tokens"):
Llama 3's vocabulary {128001 <|end_of_text|>, 128009 <|eot_id|>}, SmolLM2's {0 <|endoftext|>,
2 <|im_end|>, 4 <reponame>}, Qwen2's {151643 <|endoftext|>, 151645 <|im_end|>} (and 128247, an
ordinary "</s>" token llama.cpp also takes, which Hetero leaves out: gguf_stop_tokens)."""

from __future__ import annotations

import json

import pytest

from hetero_core.default_plugins.hf_tokenizer import HFTokenizer
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.requests.params_tokens import resolve_token_params
from hetero_core.model.embedded import find_embedded_gguf
from hetero_core.model.gguf_cache import ensure_gguf_converted
from tests.model.gguf_vocab import unpack_vocab, write_vocab_copy

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocab")
    return {name: unpack_vocab(name, folder) for name in ("llama-bpe", "qwen2")}


def converted_ends(path, cache) -> tuple[list[int], HFTokenizer]:
    model_dir = ensure_gguf_converted(path, cache)
    listed = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    return listed, HFTokenizer(model_dir)


@pytest.mark.parametrize(
    ("name", "eos", "others"), [("llama-bpe", 128001, [128009]), ("qwen2", 151643, [151645])]
)
def test_end_of_turn_tokens_become_stop_ids(name, eos, others, vocab_files, tmp_path):
    listed, tokenizer = converted_ends(vocab_files[name], tmp_path)
    assert listed == [eos, *others]
    assert tokenizer.eos_token_id == eos and tokenizer.stop_token_ids == tuple(others)


def test_the_embedded_smollm2_stops_at_llama_cpps_three(tmp_path):
    listed, tokenizer = converted_ends(find_embedded_gguf(), tmp_path)
    assert listed[0] == 2 and sorted(listed) == [0, 2, 4]
    assert tokenizer.eos_token_id == 2 and sorted(tokenizer.stop_token_ids) == [0, 4]


def test_named_eot_and_eom_ids_join_and_an_eot_eos_comes_first(vocab_files, tmp_path):
    """A Llama 3.1 Instruct conversion names <|eot_id|> as its EOS and may name EOT/EOM ids."""
    fields = {"tokenizer.ggml.eos_token_id": 128009, "tokenizer.ggml.eom_token_id": 128008}
    copy = write_vocab_copy(vocab_files["llama-bpe"], tmp_path / "instruct.gguf", **fields)
    listed, tokenizer = converted_ends(copy, tmp_path / "cache")
    assert listed == [128009, 128008, 128001]
    assert tokenizer.eos_token_id == 128009 and tokenizer.stop_token_ids == (128008, 128001)


class PlainTokenizer:
    vocab_size = 100
    eos_token_id = 1


class StopTokenizer(PlainTokenizer):
    stop_token_ids = (7, 9)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (SamplingParams(), (7, 9)),
        (SamplingParams(stop_token_ids=[9, 5]), (9, 5, 7)),
        (SamplingParams(ignore_eos=True, stop_token_ids=[5]), (5,)),  # like EOS, they then end nothing
    ],
)
def test_a_tokenizers_stop_ids_join_each_request(given, expected):
    assert resolve_token_params(given, StopTokenizer()).stop_token_ids == expected
    assert resolve_token_params(given, PlainTokenizer()).stop_token_ids == given.stop_token_ids
