"""Perplexity the way llama.cpp's ``llama-perplexity`` measures it, so the two figures compare.

Its method (tools/perplexity, the default, no ``--ppl-stride``): the whole text is tokenized once
(a BOS in front when the model's vocabulary adds one); the tokens are cut into ``n_ctx``-token
chunks, as many whole chunks as fit (the rest is dropped; fewer than two chunks is an error); each
chunk is evaluated alone from an empty cache, its first token replaced by BOS when the vocabulary
adds one; only the second half is scored: the logits at positions ``n_ctx/2 .. n_ctx-2`` against
the tokens after them, ``n_ctx - 1 - n_ctx/2`` tokens a chunk. The perplexity is exp of the mean
negative log-likelihood over every scored token. Here each chunk is one prompt with
``prompt_logprobs``: the entry at position ``i`` is the log-probability of token ``i`` given the
tokens before it, so the scored entries are ``n_ctx/2 + 1 .. n_ctx - 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetero_core import HeteroError


@dataclass(frozen=True)
class Chunks:
    prompts: list[list[int]]  # one n_ctx-token prompt a chunk, BOS first when the vocabulary adds one
    first_scored: int  # the index in each prompt of its first scored token
    num_text_tokens: int  # tokens of the whole text (with the leading BOS, if any)


def perplexity_chunks(text_ids: list[int], n_ctx: int, bos_id: int | None) -> Chunks:
    """``text_ids`` (the text's tokens, no BOS) as llama-perplexity's chunks of ``n_ctx``;
    ``bos_id``: the BOS the vocabulary adds (None: it adds none)."""
    if n_ctx < 4 or n_ctx % 2:
        raise HeteroError(f"--ctx {n_ctx}: expected an even number of tokens >= 4")
    tokens = ([bos_id] if bos_id is not None else []) + list(text_ids)
    if len(tokens) < 2 * n_ctx:
        raise HeteroError(
            f"the text is {len(tokens)} tokens; perplexity with --ctx {n_ctx} needs at least {2 * n_ctx} "
            "(two chunks, as llama-perplexity does): give a longer text or a smaller --ctx"
        )
    prompts = []
    for start in range(0, len(tokens) // n_ctx * n_ctx, n_ctx):
        chunk = tokens[start : start + n_ctx]
        if bos_id is not None:
            chunk[0] = bos_id
        prompts.append(chunk)
    return Chunks(prompts, n_ctx // 2 + 1, len(tokens))


def chunked_perplexity(llm, chunks: Chunks) -> dict:
    """Score ``chunks`` with ``llm`` (a ``hetero_core.LLM``): perplexity, its standard error as
    llama.cpp prints it (``+/-``), scored token count and chunk count."""
    from hetero_core import SamplingParams

    scoring = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in chunks.prompts], scoring, use_tqdm=False)
    if any(out.prompt_logprobs is None for out in outputs):
        raise HeteroError("the engine returned no prompt logprobs: its executor cannot score a text")
    nll = [
        -entry[token].logprob
        for out in outputs
        for entry, token in zip(
            out.prompt_logprobs[chunks.first_scored :], out.prompt_token_ids[chunks.first_scored :]
        )
    ]
    return perplexity_summary(nll, len(chunks.prompts))


def perplexity_summary(nll: list[float], num_chunks: int) -> dict:
    """exp(mean NLL) and llama.cpp's ``+/-``: ppl * sqrt(var(NLL) / (n - 1))."""
    count = len(nll)
    mean = sum(nll) / count
    variance = sum(x * x for x in nll) / count - mean * mean
    error = math.sqrt(variance / (count - 1)) if variance > 0 and count > 1 else 0.0
    ppl = math.exp(mean)
    return {"perplexity": ppl, "perplexity_error": ppl * error, "scored_tokens": count, "chunks": num_chunks}
