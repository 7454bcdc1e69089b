"""The tokens that end generation for a GGUF model, found as llama.cpp finds them.

A GGUF names one EOS (``tokenizer.ggml.eos_token_id``), but a chat model ends its turn with another
token: Llama 3 with ``<|eot_id|>`` (and ``<|eom_id|>`` after a tool call) while its EOS is often
``<|end_of_text|>``, Qwen with ``<|im_end|>`` beside ``<|endoftext|>``. llama.cpp stops at all of them
(its "end-of-generation" set, ``src/llama-vocab.cpp``): the EOS, EOT and EOM the file names, the
tokens it recognises by their text, and the FIM pad / repo / file-separator tokens. The same set is
written into the converted model's generation_config.json as the ``eos_token_id`` list, which the
hf tokenizer turns into its stop ids, as vLLM does with an HF checkpoint's list.

Left out of llama.cpp's text list: the markers of model families Hetero does not run (gpt-oss's
``<|return|>``/``<|call|>``, Kimi's, Gemma 4's, MiniMax's) and ``</s>``, which llama.cpp lists for
PaddleOCR and which is an ordinary token in Qwen's vocabulary.
"""

from __future__ import annotations

from hetero_core.model.gguf_checkpoint import field_value, named_token_id

__all__ = ["end_of_generation_ids"]

# Named ids of the file, in the order they are listed after the EOS.
_NAMED = ("eot", "eom", "fim_pad", "fim_rep", "fim_sep")
# Texts llama.cpp takes for end of turn / end of text, whatever the file names.
END_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end_of_text|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|end|>",
        "<end_of_turn>",
        "<EOT>",
        "_<EOT>",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    }
)
# FIM tokens llama.cpp finds by text when the file does not name them (the first found of each kind).
_FIM_TEXTS = {
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


def end_of_generation_ids(reader) -> list[int]:
    """The GGUF's EOS first (when it names one in its vocabulary), then every other token that ends
    generation, each once (``reader``: the file's fields, as ``open_gguf`` reads them)."""
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    if not tokens:
        return []
    positions: dict[str, int] = {}
    for index, token in enumerate(tokens):
        positions.setdefault(token, index)

    ids = [named_token_id(reader, "eos", len(tokens))]
    for name in _NAMED:
        found = named_token_id(reader, name, len(tokens))
        if found is None and name in _FIM_TEXTS:
            found = next((positions[t] for t in _FIM_TEXTS[name] if t in positions), None)
        ids.append(found)
    ids += sorted(positions[text] for text in END_TEXTS if text in positions)
    return list(dict.fromkeys(i for i in ids if i is not None))
