"""The prompts of ``hetero bench spec-decode``: one workload where prompt lookup should pay, one where it
should not.

- ``lookup``: the model is asked to repeat or lightly edit a paragraph its prompt contains (the
  paragraphs of ``data/spec_decode_text.txt``, one per request, through the chat template when the
  tokenizer has one): the output copies spans of the prompt.
- ``random``: prompts of random token ids (from id 100 up: no special tokens), fixed by the seed:
  nothing in the output repeats the prompt except by chance.
"""

from __future__ import annotations

import random
from importlib.resources import files

from hetero_core import InvalidRequestError

WORKLOADS = ("lookup", "random")
INSTRUCTIONS = (
    "Repeat the following text word for word.",
    "Rewrite the following text, changing only its first sentence.",
    "Copy the following text exactly, then stop.",
)


def paragraphs() -> list[str]:
    text = (files("hetero_bench") / "data" / "spec_decode_text.txt").read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def workload_prompts(
    name: str, tokenizer, num_prompts: int, prompt_tokens: int, seed: int
) -> list[list[int]]:
    """``num_prompts`` prompts (token ids) of workload ``name``."""
    if name == "random":
        rng = random.Random(seed)
        high = tokenizer.vocab_size - 1
        return [[rng.randint(100, high) for _ in range(prompt_tokens)] for _ in range(num_prompts)]
    texts = paragraphs()
    prompts = []
    for i in range(num_prompts):
        message = f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}\n\n{texts[i % len(texts)]}"
        try:
            prompts.append(list(tokenizer.encode_chat([{"role": "user", "content": message}])))
        except InvalidRequestError:  # a tokenizer without a chat template
            prompts.append(list(tokenizer.encode(message + "\n\n")))
    return prompts
