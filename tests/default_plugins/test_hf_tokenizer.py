"""The hf tokenizer against transformers' AutoTokenizer on the embedded SmolLM2 directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from hetero_core.default_plugins.hf_tokenizer import HFTokenizer, HFTokenizerOptions, create_hf_tokenizer
from hetero_core.engine.requests.detokenizer import IncrementalDetokenizer
from hetero_core.errors import ConfigError, InvalidRequestError, ModelLoadError
from hetero_core.tokenizer import Tokenizer, TokenizerContext

pytestmark = pytest.mark.slow

TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. It's 3:45pm!",
    "chinese": "你好，世界！",
    "emoji": "Launch 🚀🔥 done 👍🏽 — ok 🇫🇷",
    "code": 'def f(x: int) -> int:\n    """Square."""\n\treturn x ** 2  # {"a": [1, 2]}\n',
    "specials": "<|im_start|>user\nhi<|im_end|> and <|endoftext|>",
    "empty": "",
}
CHATS = {
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2? 你好"},
    ],
    "user_only": [{"role": "user", "content": "Tell me a joke 😀"}],
    "multi_turn": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ],
}
TEMPLATE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def hf(smollm2_dir) -> HFTokenizer:
    return HFTokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_dir))


def copy_tokenizer(src: Path, dst: Path, **json_edits) -> Path:
    """Copy the tokenizer files to ``dst``; ``json_edits`` maps a file stem to a function that
    edits that file's JSON in place (``tokenizer_config=lambda c: ...``)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in TEMPLATE_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    for stem, edit in json_edits.items():
        path = dst / f"{stem}.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        edit(data)
        path.write_text(json.dumps(data))
    return dst


def chat_ids(reference, messages, **kwargs) -> list[int]:
    out = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_factory_builds_from_the_model_dir(smollm2_dir):
    tok = create_hf_tokenizer(TokenizerContext(options=None, model_dir=smollm2_dir))
    assert isinstance(tok, Tokenizer)
    assert tok.options == HFTokenizerOptions()


def test_factory_without_a_model_says_so():
    with pytest.raises(ConfigError, match="hf tokenizer needs a model directory"):
        create_hf_tokenizer(TokenizerContext(options=None, model_dir=None))


def test_missing_or_malformed_tokenizer_json(tmp_path):
    with pytest.raises(ModelLoadError, match="tokenizer.json, which does not exist"):
        HFTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": 1}')
    with pytest.raises(ModelLoadError, match="cannot read .*tokenizer.json"):
        HFTokenizer(tmp_path)


def test_eos_is_the_chat_end_token_and_vocab_matches(hf, reference):
    assert hf.eos_token_id == reference.convert_tokens_to_ids("<|im_end|>") == 2
    assert hf.vocab_size == len(reference) == 49152


@pytest.mark.parametrize("name", TEXTS)
def test_encode_decode_parity(hf, reference, name):
    text = TEXTS[name]
    ids = hf.encode(text)
    assert ids == reference.encode(text)
    assert hf.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    if name != "specials":
        assert hf.decode(ids) == text


@pytest.mark.parametrize("name", CHATS)
def test_chat_template_parity(hf, reference, name):
    assert hf.encode_chat(CHATS[name]) == chat_ids(reference, CHATS[name])


@pytest.mark.parametrize("name", ["english", "chinese", "emoji", "code"])
def test_incremental_detokenizer_over_smollm2_tokens(hf, name):
    prompt_ids = hf.encode_chat(CHATS["user_only"])
    output_ids = hf.encode(TEXTS[name])
    detok = IncrementalDetokenizer(hf, prompt_ids)
    deltas = [detok.add(t) for t in output_ids] + [detok.flush()]
    assert "".join(deltas) == detok.text == hf.decode(output_ids) == TEXTS[name]
    assert not any("\ufffd" in d for d in deltas)


def test_some_characters_really_are_split_over_tokens(hf):
    # Otherwise the detokenizer test above would not exercise the hold-back.
    ids = hf.encode(TEXTS["emoji"] + TEXTS["chinese"])
    assert any(hf.decode([t]).endswith("\ufffd") for t in ids)


def test_add_special_tokens_option_follows_the_post_processor(smollm2_dir, tmp_path):
    def add_bos(tokenizer_json):
        bos = "<|im_start|>"
        tokenizer_json["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [1], "tokens": [bos]}},
        }

    model_dir = copy_tokenizer(smollm2_dir, tmp_path / "bos", tokenizer=add_bos)
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    with_bos = HFTokenizer(model_dir)
    without = HFTokenizer(model_dir, HFTokenizerOptions(add_special_tokens=False))
    assert with_bos.encode("Hello") == ref.encode("Hello") == [1, *without.encode("Hello")]
    assert without.encode("Hello") == ref.encode("Hello", add_special_tokens=False)
    # The chat template writes its own special tokens: no extra BOS either way.
    assert with_bos.encode_chat(CHATS["user_only"]) == chat_ids(ref, CHATS["user_only"])


def test_chat_template_option_replaces_the_models(hf, smollm2_dir, reference, tmp_path):
    source = "{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}[ASSISTANT]"
    path = tmp_path / "plain.jinja"
    path.write_text(source)
    custom = HFTokenizer(smollm2_dir, HFTokenizerOptions(chat_template=path))
    assert custom.render_chat(CHATS["user_only"]) == "[USER] Tell me a joke 😀\n[ASSISTANT]"
    assert custom.encode_chat(CHATS["system_user"]) == chat_ids(
        reference, CHATS["system_user"], chat_template=source
    )
    assert custom.encode("Hello") == hf.encode("Hello")


def test_chat_template_option_must_name_a_file(smollm2_dir, tmp_path):
    with pytest.raises(ConfigError, match="chat_template: no such file"):
        HFTokenizer(smollm2_dir, HFTokenizerOptions(chat_template=tmp_path / "missing.jinja"))


def test_options_reject_unknown_keys():
    with pytest.raises(ValidationError):
        HFTokenizerOptions(chat_templat="x.jinja")


def test_template_from_tokenizer_config_when_no_jinja_file(smollm2_dir, tmp_path, hf):
    model_dir = copy_tokenizer(smollm2_dir, tmp_path / "cfg")
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    assert HFTokenizer(model_dir).encode_chat(CHATS["user_only"]) == hf.encode_chat(CHATS["user_only"])


def test_no_chat_template_is_a_request_error(smollm2_dir, tmp_path):
    model_dir = copy_tokenizer(
        smollm2_dir, tmp_path / "none", tokenizer_config=lambda c: c.pop("chat_template", None)
    )
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(InvalidRequestError, match="no chat template"):
        HFTokenizer(model_dir).encode_chat(CHATS["user_only"])


def test_template_errors(smollm2_dir, tmp_path):
    strict = tmp_path / "strict.jinja"
    strict.write_text(
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}ok"
    )
    with pytest.raises(InvalidRequestError, match="system first"):
        HFTokenizer(smollm2_dir, HFTokenizerOptions(chat_template=strict)).encode_chat(CHATS["user_only"])
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="does not compile"):
        HFTokenizer(smollm2_dir, HFTokenizerOptions(chat_template=broken))


def test_generation_blocks_and_none_values_render_like_transformers(smollm2_dir, tmp_path):
    path = tmp_path / "gen.jinja"
    path.write_text(
        "{% for m in messages %}{% generation %}{{ m.role }}={{ m.content }}{% endgeneration %}"
        "{% if m.name is defined %}({{ m.name }}){% endif %};{% endfor %}{{ bos_token }}"
    )
    tok = HFTokenizer(smollm2_dir, HFTokenizerOptions(chat_template=path))
    rendered = tok.render_chat([{"role": "user", "content": "hi", "name": None}])
    assert rendered == "user=hi;<|im_start|>"


@pytest.mark.parametrize("messages", [[], ["hi"], "hi"])
def test_malformed_chat_messages(hf, messages):
    with pytest.raises(InvalidRequestError):
        hf.encode_chat(messages)


@pytest.mark.parametrize(
    "generation_config, expected",
    [(None, 2), ({"eos_token_id": [0, 2]}, 2), ({"eos_token_id": [0, 1]}, 0), ({"eos_token_id": 0}, 0)],
)
def test_eos_token_id_sources(smollm2_dir, tmp_path, generation_config, expected):
    model_dir = copy_tokenizer(smollm2_dir, tmp_path / "eos")
    if generation_config is not None:
        (model_dir / "generation_config.json").write_text(json.dumps(generation_config))
    assert HFTokenizer(model_dir).eos_token_id == expected


@pytest.mark.parametrize(
    "generation_config, stops",
    [
        (None, ()),
        ({"eos_token_id": [0, 2, 4]}, (0, 4)),
        ({"eos_token_id": [0, 1]}, (1,)),
        ({"eos_token_id": 0}, ()),
    ],
)
def test_the_other_listed_eos_ids_are_stop_ids(smollm2_dir, tmp_path, generation_config, stops):
    """As vLLM reads generation_config.json: the listed ids besides the EOS end a request too."""
    model_dir = copy_tokenizer(smollm2_dir, tmp_path / "stops")
    if generation_config is not None:
        (model_dir / "generation_config.json").write_text(json.dumps(generation_config))
    assert HFTokenizer(model_dir).stop_token_ids == stops


def test_named_special_tokens_missing_from_the_vocab_are_added(smollm2_dir, tmp_path):
    model_dir = copy_tokenizer(
        smollm2_dir, tmp_path / "sep", tokenizer_config=lambda c: c.update(sep_token="<|sep|>")
    )
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    tok = HFTokenizer(model_dir)
    ids = tok.encode("a<|sep|>b")
    assert ids == ref.encode("a<|sep|>b") and 49152 in ids
    assert tok.decode(ids) == "ab" and tok.vocab_size == 49153


def test_eos_from_an_added_token_dict_without_generation_config(smollm2_dir, tmp_path):
    model_dir = copy_tokenizer(
        smollm2_dir,
        tmp_path / "dict",
        tokenizer_config=lambda c: c.update(eos_token={"__type": "AddedToken", "content": "<|endoftext|>"}),
    )
    assert HFTokenizer(model_dir).eos_token_id == 0
