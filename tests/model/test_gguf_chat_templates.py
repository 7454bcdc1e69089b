"""The chat template of a GGUF (``tokenizer.chat_template``) reaches the converted model, and the hf
tokenizer's chat rendering (what ``LLM.chat`` and the OpenAI server's chat route encode) equals plain
jinja2's rendering of that template, for the real Llama 3.1 / 3.2, Qwen2.5 and Qwen3 templates written
into copies of the real vocabularies; the encoded prompts are llama.cpp's ids for them
(tests/data/gguf/vocab/chat_prompts.json: llama-tokenize of each rendering, special tokens parsed)."""

from __future__ import annotations

import json

import pytest

from hetero_core.default_plugins.hf_tokenizer import HFTokenizer
from hetero_core.model.gguf_cache import ensure_gguf_converted
from tests.model.gguf_vocab import VOCAB_DATA, chat_template, unpack_vocab, write_vocab_copy

jinja2 = pytest.importorskip("jinja2")
sandbox = pytest.importorskip("jinja2.sandbox")
pytest.importorskip("tokenizers")

TEMPLATES = {  # template -> (vocabulary, the token that ends each message)
    "meta-llama-Llama-3.1-8B-Instruct": ("llama-bpe", 128009),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama-bpe", 128009),
    "Qwen-Qwen2.5-7B-Instruct": ("qwen2", 151645),
    "Qwen-Qwen3-0.6B": ("qwen2", 151645),
}
SYSTEM = {"role": "system", "content": "You answer in one word."}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello, how are you?"}],
    "system and user": [SYSTEM, {"role": "user", "content": "Capital of France?"}],
    "several turns": [
        SYSTEM,
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?\n  With a newline 🦙."},
    ],
}
DATE = {"date_string": "02 Dec 2026"}  # Llama 3.2 would print today's date otherwise
LLAMA_CPP_IDS = json.loads((VOCAB_DATA / "chat_prompts.json").read_text())


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each template written into a copy of its vocabulary, converted as a load converts it."""
    folder = tmp_path_factory.mktemp("templates")
    vocabs = {name: unpack_vocab(name, folder) for name in ("llama-bpe", "qwen2")}
    dirs = {}
    for template, (vocab, _) in TEMPLATES.items():
        copy = write_vocab_copy(
            vocabs[vocab], folder / f"{template}.gguf", **{"tokenizer.chat_template": chat_template(template)}
        )
        dirs[template] = ensure_gguf_converted(copy, folder / "cache")
    return dirs


def jinja2_rendering(template: str, messages, add_generation_prompt: bool, **variables) -> str:
    """The template rendered by jinja2 alone, with the settings chat templates are written for
    (transformers' and llama.cpp's: blocks trimmed, loop controls, ``raise_exception``)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **variables
    )


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_gguf_template_reaches_the_converted_model(template, converted):
    config = json.loads((converted[template] / "tokenizer_config.json").read_text())
    assert config["chat_template"] == chat_template(template)
    assert HFTokenizer(converted[template]).chat_template == chat_template(template)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("template", TEMPLATES)
def test_chat_rendering_equals_jinja2s(template, conversation, add_generation_prompt, converted):
    tokenizer = HFTokenizer(converted[template])
    messages = CONVERSATIONS[conversation]
    rendered = tokenizer.render_chat(messages, add_generation_prompt, chat_template_kwargs=DATE)
    special = {
        "bos_token": tokenizer.special_tokens["bos_token"],
        "eos_token": tokenizer.special_tokens["eos_token"],
    }
    expected = jinja2_rendering(chat_template(template), messages, add_generation_prompt, **special, **DATE)
    assert rendered == expected
    assert all(m["content"] in rendered for m in messages)

    ids = tokenizer.encode_chat(messages, add_generation_prompt, chat_template_kwargs=DATE)
    prompt = f"{conversation}, generation prompt {'on' if add_generation_prompt else 'off'}"
    assert ids == LLAMA_CPP_IDS[template][prompt]
    end_of_turn = TEMPLATES[template][1]
    assert ids.count(end_of_turn) == rendered.count(
        tokenizer.decode([end_of_turn], skip_special_tokens=False)
    )
    assert ids.count(end_of_turn) >= len(messages)
    assert tokenizer.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=False) == rendered
    if TEMPLATES[template][0] == "llama-bpe":  # the template writes BOS itself; none is added twice
        assert ids[0] == 128000 and ids.count(128000) == 1


def test_transformers_renders_the_converted_template_alike(converted):
    transformers = pytest.importorskip("transformers")
    template = "Qwen-Qwen2.5-7B-Instruct"
    reference = transformers.AutoTokenizer.from_pretrained(str(converted[template]))
    ours = HFTokenizer(converted[template])
    for messages in CONVERSATIONS.values():
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.render_chat(messages) == expected
        assert ours.encode_chat(messages) == reference(expected, add_special_tokens=False)["input_ids"]
