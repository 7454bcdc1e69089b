"""Remake the ids of this folder that llama.cpp's ``llama-tokenize`` gives (README.md).

    python tests/data/gguf/vocab/make_llama_cpp_ids.py /path/to/llama-tokenize

writes ``smollm2.gguf.out`` (the cases of llama-bpe.gguf.inp through the embedded SmolLM2 GGUF, as
llama.cpp's tests/test-tokenizer-0.cpp tokenizes them: no BOS, special tokens' text not parsed) and
``chat_prompts.json`` (each chat template's rendering of tests/model/test_gguf_chat_templates.py's
conversations, special tokens parsed, no BOS added: the templates write it). Run from the repository
root with the project's environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hetero_core.model.embedded import find_embedded_gguf
from tests.model.gguf_vocab import VOCAB_DATA, chat_template, unpack_vocab, vocab_cases, write_vocab_copy
from tests.model.test_gguf_chat_templates import CONVERSATIONS, DATE, TEMPLATES, jinja2_rendering

# The named tokens the templates see, as the converted tokenizer_config.json of each vocabulary says.
SPECIAL = {
    "llama-bpe": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
    "qwen2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
}


def llama_cpp_ids(tool: str, model: Path, text: str, folder: Path, parse_special: bool) -> list[int]:
    prompt = folder / "prompt.txt"
    prompt.write_bytes(text.encode("utf-8"))
    command = [tool, "-m", str(model), "-f", str(prompt), "--no-escape", "--ids", "--no-bos", "--log-disable"]
    if not parse_special:
        command.append("--no-parse-special")
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads([line for line in output.splitlines() if line.startswith("[")][-1])


def main(tool: str) -> None:
    folder = Path(tempfile.mkdtemp())
    smollm2 = find_embedded_gguf()
    lines = [llama_cpp_ids(tool, smollm2, text, folder, False) for text, _ in vocab_cases("llama-bpe")]
    (VOCAB_DATA / "smollm2.gguf.out").write_text("".join("".join(f" {i}" for i in ids) + "\n" for ids in lines))
    prompts: dict[str, dict[str, list[int]]] = {}
    for template, (vocab, _) in TEMPLATES.items():
        source = chat_template(template)
        model = write_vocab_copy(
            unpack_vocab(vocab, folder), folder / f"{template}.gguf", **{"tokenizer.chat_template": source}
        )
        for name, messages in CONVERSATIONS.items():
            for generation_prompt in (True, False):
                text = jinja2_rendering(source, messages, generation_prompt, **SPECIAL[vocab], **DATE)
                key = f"{name}, generation prompt {'on' if generation_prompt else 'off'}"
                prompts.setdefault(template, {})[key] = llama_cpp_ids(tool, model, text, folder, True)
    blocks = [
        f"  {json.dumps(t)}: {{\n" + ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in p.items()) + "\n  }"
        for t, p in prompts.items()
    ]
    (VOCAB_DATA / "chat_prompts.json").write_text("{\n" + ",\n".join(blocks) + "\n}\n")


if __name__ == "__main__":
    main(sys.argv[1])
