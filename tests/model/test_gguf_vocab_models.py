"""A downloaded GGUF runs alone: a tiny random-weight Llama carrying the real Llama 3 vocabulary, and a
tiny Qwen2 carrying Qwen2's, loaded by ``LLM(model="FILE.gguf")`` with no HF directory. The prompt's
token ids are llama.cpp's (BOS first for Llama 3), a chat is rendered by the file's template into
llama.cpp's ids, and generation ends at the end-of-turn token though the file's EOS is another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero_core import LLM, SamplingParams
from hetero_core.model.cpu.kernels import load_cpu_kernels
from tests.model.gguf_vocab import add_fields, chat_template, gguf_fields, unpack_vocab, vocab_cases
from tests.model.test_gguf_chat_templates import CONVERSATIONS, DATE, LLAMA_CPP_IDS
from tests.model.tiny_gguf import write_tiny_gguf
from tests.model.tiny_models import _COMMON, random_hf_model

transformers = pytest.importorskip("transformers")

MODELS = {  # vocabulary -> (config class, chat template, BOS llama.cpp adds, EOS, end of turn)
    "llama-bpe": ("LlamaConfig", "meta-llama-Llama-3.1-8B-Instruct", [128000], 128001, 128009),
    "qwen2": ("Qwen2Config", "Qwen-Qwen2.5-7B-Instruct", [], 151643, 151645),
}


def tiny_gguf_with_vocabulary(name: str, folder: Path) -> Path:
    """A tiny GGUF of random weights whose tokenizer is the real vocabulary's fields, with the chat
    template added."""
    config_class, template, _, eos, _ = MODELS[name]
    vocab = gguf_fields(unpack_vocab(name, folder), "tokenizer.")
    vocab["tokenizer.chat_template"] = (chat_template(template), *vocab["tokenizer.ggml.model"][1:])
    size = len(vocab["tokenizer.ggml.tokens"][0])
    config = getattr(transformers, config_class)(
        **{**_COMMON, "vocab_size": size, "tie_word_embeddings": True, "eos_token_id": eos}
    )
    path = folder / f"tiny-{name}.gguf"
    write_tiny_gguf(random_hf_model(config), path, lambda writer: add_fields(writer, vocab))
    return path


@pytest.mark.parametrize("name", MODELS)
def test_a_gguf_with_a_real_vocabulary_runs_alone(name, tmp_path, monkeypatch):
    """One engine a vocabulary (each start takes seconds): the checks below run on it in turn."""
    path = tiny_gguf_with_vocabulary(name, tmp_path)
    load_cpu_kernels()  # built once in the user's cache, as for every test; the conversion goes elsewhere
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    llm = LLM(model=str(path), executor="torch", max_model_len=256, max_num_seqs=4, max_num_blocks=64)
    try:
        check_the_converted_files(name, llm)
        check_prompt_token_ids(name, llm)
        check_chat_prompts(name, llm)
        check_stopping(name, llm)
    finally:
        llm.shutdown()


def check_the_converted_files(name: str, llm: LLM) -> None:
    """No HF directory was given: the tokenizer, its template and the stop ids all come from the GGUF."""
    config = json.loads((llm.model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == chat_template(MODELS[name][1])
    generation = json.loads((llm.model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [MODELS[name][3], MODELS[name][4]]


def check_prompt_token_ids(name: str, llm: LLM) -> None:
    """Plain prompts: llama.cpp's ids of the text, after BOS for Llama 3."""
    bos = MODELS[name][2]
    cases = [case for case in vocab_cases(name) if case[0]][10:20]
    outputs = llm.generate(
        [text for text, _ in cases], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False
    )
    assert [out.prompt_token_ids for out in outputs] == [[*bos, *ids] for _, ids in cases]
    assert all(len(out.output_token_ids) == 2 and not out.failed for out in outputs)
    assert all(out.prompt == text for out, (text, _) in zip(outputs, cases, strict=True))


def check_chat_prompts(name: str, llm: LLM) -> None:
    """LLM.chat: the file's template rendered and encoded into llama.cpp's ids for that rendering."""
    template = MODELS[name][1]
    assert llm.has_chat_template
    for conversation in ("user", "several turns"):
        [out] = llm.chat(
            CONVERSATIONS[conversation],
            SamplingParams(max_tokens=1),
            use_tqdm=False,
            chat_template_kwargs=DATE,
        )
        assert out.prompt_token_ids == LLAMA_CPP_IDS[template][f"{conversation}, generation prompt on"]


def check_stopping(name: str, llm: LLM) -> None:
    """The model is pushed to the end-of-turn token (logit_bias): it ends the request without text, as
    the EOS does, though the file's EOS is another token; with ignore_eos neither ends it."""
    _, _, _, eos, end_of_turn = MODELS[name]
    assert llm.get_tokenizer().eos_token_id == eos
    prompt = [{"role": "user", "content": "Hi"}]
    pushed = SamplingParams(max_tokens=8, temperature=0, logit_bias={end_of_turn: 100.0})
    [out] = llm.chat(prompt, pushed, use_tqdm=False)
    assert out.output_token_ids == [end_of_turn] and out.text == ""
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == end_of_turn
    ignoring = SamplingParams(max_tokens=3, temperature=0, logit_bias={end_of_turn: 100.0}, ignore_eos=True)
    [ignored] = llm.chat(prompt, ignoring, use_tqdm=False)
    assert ignored.output_token_ids == [end_of_turn] * 3 and ignored.finish_reason == "length"
    at_eos = SamplingParams(max_tokens=8, temperature=0, logit_bias={eos: 100.0})
    [ended] = llm.generate(["Hi"], at_eos, use_tqdm=False)
    assert ended.output_token_ids == [eos] and ended.finish_reason == "eos"
