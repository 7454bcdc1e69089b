"""Prompt logprobs (``SamplingParams.prompt_logprobs``), as vLLM gives them.

``RequestOutput.prompt_logprobs`` is a list with one entry per prompt token: None for the first
(nothing predicts it), then a vLLM ``dict[int, Logprob]`` holding the prompt token (its logprob
and its rank in the whole vocabulary, 1: the most likely) and the ``k`` most likely tokens (ranks
1..k, best first); ``k = 0``: the prompt token alone. Logprobs are fp32 ``log_softmax`` of the raw
model logits (no temperature or penalties, as vLLM's default ``logprobs_mode``).

Where the logits come from: the batch flags the prefill segments of such requests
(``Batch.prompt_logits``, built by ``batch_builder``) and an executor that declares
``supports_prompt_logits=True`` in its ``capabilities`` returns the logits of every row of those segments
(``ExecutorOutput.prompt_logits``). Chunked prefill adds entries chunk by chunk; a recompute after
preemption runs positions whose entries exist already and they are not added twice (an entry is
added only for the next prompt token missing). A request asking for prompt logprobs never starts
from the prefix cache (``scheduler``): every prompt token's logits are computed.
"""

from __future__ import annotations

from hetero_core.engine.sampling.logprobs import Logprob
from hetero_core.errors import InvalidRequestError


def prompt_logprobs_refusal(executor) -> str | None:
    """Why ``executor`` cannot give prompt logprobs (None: it can)."""
    if executor.capabilities.supports_prompt_logits:
        return None
    return (
        f"prompt_logprobs is not supported by the executor {type(executor).__name__}: it does not "
        "return logits for prompt positions (it does not declare supports_prompt_logits); use an "
        "executor that runs the model (torch, triton, cuda) or leave prompt_logprobs None"
    )


def check_prompt_logprobs(params, refusal: str | None) -> None:
    """Raise InvalidRequestError when ``params`` ask for prompt logprobs the executor cannot give."""
    if refusal is not None and params.prompt_logprobs is not None:
        raise InvalidRequestError(refusal)


def add_prompt_logprobs(scheduled, prompt_logits: list | None, token_text) -> None:
    """Add the entries of the prompt segments ``scheduled`` ran (``prompt_logits``: one
    ``[query_len, vocab]`` tensor per flagged sequence) to their sequences' ``prompt_logprobs``.
    ``token_text(token_id)``: a token's text (``Logprob.decoded_token``)."""
    batch = scheduled.batch
    if batch.prompt_logits is None or prompt_logits is None:
        return
    indices = batch.prompt_logits_indices
    if len(prompt_logits) != len(indices):
        raise ValueError(
            f"executor returned prompt logits for {len(prompt_logits)} sequences, "
            f"the batch flags {len(indices)}"
        )
    for i, logits in zip(indices, prompt_logits):
        seq = scheduled.seqs[i]
        if seq.status.is_done:
            continue
        entries = seq.prompt_logprobs if seq.prompt_logprobs is not None else [None]
        first = batch.positions[batch.query_start_loc[i]]
        # row j predicts the token at position first + j + 1: keep those not yet recorded
        start = len(entries) - 1 - first
        stop = min(logits.shape[0], len(seq.prompt_token_ids) - 1 - first)
        if start < 0 or stop <= start:
            seq.prompt_logprobs = entries
            continue
        targets = seq.prompt_token_ids[first + start + 1 : first + stop + 1]
        # a new list: outputs already handed out keep theirs unchanged
        seq.prompt_logprobs = entries + position_logprobs(
            logits[start:stop], targets, seq.params.prompt_logprobs, token_text
        )


def position_logprobs(logits, targets: list[int], k: int, token_text) -> list[dict[int, Logprob]]:
    """One vLLM entry per row of ``logits``: ``targets[j]`` with its rank, then the top ``k``."""
    import torch

    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
    chosen = logprobs.gather(1, target[:, None])
    ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
    chosen = chosen[:, 0].tolist()
    if k:
        top_values, top_ids = logprobs.topk(k, dim=-1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    entries = []
    for j, token_id in enumerate(targets):
        entry = {token_id: Logprob(chosen[j], ranks[j], token_text(token_id))}
        for rank, (tid, value) in enumerate(zip(top_ids[j], top_values[j]) if k else (), start=1):
            entry.setdefault(tid, Logprob(value, rank, token_text(tid)))
        entries.append(entry)
    return entries
