"""A GGUF's tokenizer converted the way a model load converts it (``ensure_gguf_converted``) and read
by the hf tokenizer gives llama.cpp's token ids on llama.cpp's own test cases, for the real Llama 3,
Qwen2 (Qwen2.5, Qwen3) and Qwen3.5 vocabularies and the embedded SmolLM2's (tests/data/gguf/vocab).

As llama.cpp's tests/test-tokenizer-0.cpp tokenizes them: no BOS, special tokens' text not parsed
(none of the cases holds one); plain text then gets BOS where llama.cpp adds it (Llama 3)."""

from __future__ import annotations

import pytest

from hetero_core.default_plugins.hf_options import HFTokenizerOptions
from hetero_core.default_plugins.hf_tokenizer import HFTokenizer
from hetero_core.errors import ModelLoadError
from hetero_core.model.embedded import find_embedded_gguf
from hetero_core.model.gguf_cache import ensure_gguf_converted
from hetero_core.testing import TokenizerContract
from tests.model.gguf_vocab import chat_template, gguf_fields, unpack_vocab, vocab_cases, write_vocab_copy

pytest.importorskip("tokenizers")

# vocabulary -> the .inp and .out fixtures of its cases
CASES = {"llama-bpe": ("llama-bpe", None), "qwen2": ("qwen2", None), "qwen35": ("qwen35", None)}
SMOLLM2_CASES = ("llama-bpe", "smollm2")  # llama.cpp's ids for the standard cases (README.md)
BOS = {"llama-bpe": 128000}  # llama.cpp adds BOS for Llama 3's pre-tokenizer; none for Qwen's


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory):
    """Each vocabulary's GGUF: the two shipped, and Qwen3.5's (Qwen2's vocabulary with its own
    pre-tokenizer type, llama.cpp's ggml-vocab-qwen35.gguf differs from ggml-vocab-qwen2.gguf in that
    field alone)."""
    folder = tmp_path_factory.mktemp("vocab")
    files = {name: unpack_vocab(name, folder) for name in ("llama-bpe", "qwen2")}
    files["qwen35"] = write_vocab_copy(
        files["qwen2"], folder / "qwen35.gguf", **{"tokenizer.ggml.pre": "qwen35"}
    )
    return files


@pytest.fixture(scope="module")
def converted(vocab_files, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return {name: ensure_gguf_converted(path, cache) for name, path in vocab_files.items()}


def raw_tokenizer(model_dir) -> HFTokenizer:
    return HFTokenizer(model_dir, HFTokenizerOptions(add_special_tokens=False))


@pytest.mark.parametrize("name", CASES)
def test_every_case_encodes_to_llama_cpps_ids_and_back(name, converted):
    tokenizer = raw_tokenizer(converted[name])
    cases = vocab_cases(*CASES[name])
    assert len(cases) >= 46
    wrong = [(text, tokenizer.encode(text), ids) for text, ids in cases if tokenizer.encode(text) != ids]
    assert wrong == []
    assert [text for text, ids in cases if tokenizer.decode(ids) != text] == []


def test_the_embedded_smollm2_encodes_to_llama_cpps_ids_and_back(tmp_path):
    """The SmolLM2 GGUF's ``smollm`` pre-tokenizer splits off every digit: "½" is one ("4 ½" was
    one token short through transformers' converter)."""
    tokenizer = raw_tokenizer(ensure_gguf_converted(find_embedded_gguf(), tmp_path))
    cases = vocab_cases(*SMOLLM2_CASES)
    assert [(text, ids) for text, ids in cases if tokenizer.encode(text) != ids] == []
    assert [text for text, ids in cases if tokenizer.decode(ids) != text] == []
    assert tokenizer.encode("ied 4 ½ months") == [885, 216, 36, 216, 16738, 2704]


def test_a_word_in_the_vocabulary_is_one_token_in_llama_3(converted):
    """Llama 3 ignores merges for a piece that is a vocabulary entry (" Việt" is one token, though
    its merges alone would cut it in three)."""
    tokenizer = raw_tokenizer(converted["llama-bpe"])
    assert tokenizer.encode("Cửa Việt") == [34, 91163, 101798]


@pytest.mark.parametrize("name", CASES)
def test_plain_text_gets_bos_where_llama_cpp_adds_it(name, converted):
    tokenizer = HFTokenizer(converted[name])  # the engine's default: the tokenizer's special tokens added
    bos = [BOS[name]] if name in BOS else []
    for text, ids in vocab_cases(*CASES[name])[10:14]:
        assert tokenizer.encode(text) == [*bos, *ids]
    assert tokenizer.encode("") == bos
    assert tokenizer.decode(tokenizer.encode("Hello world")) == "Hello world"


@pytest.mark.parametrize(("name", "flag", "first"), [("llama-bpe", False, 9906), ("qwen2", True, 151643)])
def test_the_files_add_bos_token_overrides_the_default(name, flag, first, vocab_files, tmp_path):
    copy = write_vocab_copy(
        vocab_files[name], tmp_path / "flag.gguf", **{"tokenizer.ggml.add_bos_token": flag}
    )
    assert HFTokenizer(ensure_gguf_converted(copy, tmp_path / "cache")).encode("Hello")[0] == first


@pytest.mark.parametrize(
    ("name", "text", "special"),
    [
        ("llama-bpe", "<|start_header_id|>", 128006),
        ("llama-bpe", "<|eot_id|>", 128009),
        ("qwen2", "<|im_end|>", 151645),
    ],
)
def test_control_tokens_are_whole_special_tokens(name, text, special, converted):
    tokenizer = raw_tokenizer(converted[name])
    ids = tokenizer.encode(f"Hi{text}there")
    assert special in ids and len(ids) == 3
    assert tokenizer.decode(ids) == "Hithere"
    assert (
        tokenizer.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=False)
        == f"Hi{text}there"
    )


def test_user_defined_tokens_are_whole_and_decoded_as_text(converted):
    """Qwen2's GGUF types its padding entries user-defined: llama.cpp matches them whole, as text."""
    tokenizer = raw_tokenizer(converted["qwen2"])
    assert tokenizer.encode("a[PAD151700]b") == [64, 151700, 65]
    assert tokenizer.decode([64, 151700, 65]) == "a[PAD151700]b"
    assert tokenizer.vocab_size == 151936


def test_transformers_reads_the_converted_files_alike(converted):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(converted["llama-bpe"]))
    ours = HFTokenizer(converted["llama-bpe"])
    for text, _ in vocab_cases("llama-bpe"):
        assert reference.encode(text) == ours.encode(text), text


@pytest.mark.parametrize(
    ("pre", "named"), [("tekken", "pre-tokenizer type 'tekken'"), (None, "no pre-tokenizer type")]
)
def test_an_unknown_pre_tokenizer_type_is_one_clear_line(pre, named, vocab_files, tmp_path):
    copy = write_vocab_copy(vocab_files["qwen2"], tmp_path / "odd.gguf", **{"tokenizer.ggml.pre": pre})
    with pytest.raises(ModelLoadError) as error:
        ensure_gguf_converted(copy, tmp_path / "cache")
    message = str(error.value)
    assert named in message and "known: deepseek-r1-qwen, llama-bpe" in message and "\n" not in message
    assert "HF directory" in message
    assert not list((tmp_path / "cache").glob("odd-*"))  # nothing half-converted is left


@pytest.mark.parametrize(
    ("merge", "named"),
    [("Ġt", "merge 3 of its tokenizer (tokenizer.ggml.merges) is 'Ġt', not two tokens"), ("Ġ ☃☃", "☃☃")],
)
def test_damaged_merges_are_one_clear_line(merge, named, vocab_files, tmp_path):
    merges = gguf_fields(vocab_files["qwen2"], "tokenizer.ggml.merges")["tokenizer.ggml.merges"][0]
    merges[3] = merge
    copy = write_vocab_copy(
        vocab_files["qwen2"], tmp_path / "damaged.gguf", **{"tokenizer.ggml.merges": merges}
    )
    with pytest.raises(ModelLoadError) as error:
        ensure_gguf_converted(copy, tmp_path / "cache")
    assert named in str(error.value) and "damaged.gguf" in str(error.value) and "\n" not in str(error.value)


class TestAConvertedLlama3GGUFTokenizer(TokenizerContract):
    """The kit every tokenizer passes, on the Llama 3 vocabulary converted with its chat template."""

    special_tokens = {"<|eot_id|>": 128009, "<|start_header_id|>": 128006, "<|begin_of_text|>": 128000}

    @pytest.fixture(autouse=True)
    def _model_dir(self, vocab_files, tmp_path_factory):
        if not hasattr(type(self), "model_dir"):
            folder = tmp_path_factory.mktemp("contract")
            template = {"tokenizer.chat_template": chat_template("meta-llama-Llama-3.1-8B-Instruct")}
            copy = write_vocab_copy(vocab_files["llama-bpe"], folder / "llama3.gguf", **template)
            type(self).model_dir = ensure_gguf_converted(copy, folder / "cache")

    def make_tokenizer(self):  # without BOS: the kit checks that a special token's text is its one id
        return raw_tokenizer(self.model_dir)
