"""The executor kit's checks of what ``execute()`` returned, each raising ``ContractFailure`` with the
rule and the offending value (``executor_contract`` runs them)."""

from __future__ import annotations

from hetero_core.executor import ExecutorOutput
from hetero_core.testing.contract_failure import ContractFailure

ONE_ROW = "one output row per sampled sequence"


def check_output(output, num_rows: int, vocab_size: int, executor_vocab_size: int | None) -> None:
    """``output`` is an ExecutorOutput with ``num_rows`` rows: token ids below the executor's
    ``vocab_size`` attribute (if it has one, else ``ctx.vocab_size``) or finite float logits
    ``[num_rows, vocab]`` (as wide as the executor's ``vocab_size`` attribute, if it has one)."""
    if not isinstance(output, ExecutorOutput):
        raise ContractFailure("execute(batch) returns an ExecutorOutput", f"got {type(output).__name__}")
    if output.token_ids is not None:
        vocab_size = executor_vocab_size or vocab_size
        if len(output.token_ids) != num_rows:
            raise ContractFailure(
                ONE_ROW, f"{len(output.token_ids)} token ids for {num_rows} sampled sequences"
            )
        for row, token_id in enumerate(output.token_ids):
            if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < vocab_size:
                raise ContractFailure(
                    f"token ids are ints in [0, vocab_size = {vocab_size})", f"row {row} is {token_id!r}"
                )
        return
    import torch

    logits = output.logits
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ContractFailure("logits are a 2-D tensor [rows, vocab]", f"got {shape}")
    if logits.shape[0] != num_rows:
        raise ContractFailure(ONE_ROW, f"{logits.shape[0]} logits rows for {num_rows} sampled sequences")
    if logits.shape[1] < 1:
        raise ContractFailure("logits have one column per token of the vocabulary", "got 0 columns")
    if executor_vocab_size and logits.shape[1] != executor_vocab_size:
        raise ContractFailure(
            f"logits have one column per token of the executor's vocab_size ({executor_vocab_size})",
            f"got {logits.shape[1]}",
        )
    if not logits.dtype.is_floating_point:
        raise ContractFailure("logits are floating point", f"got {logits.dtype}")
    if not bool(torch.isfinite(logits).all()):
        bad = int((~torch.isfinite(logits)).any(dim=1).nonzero()[0])
        raise ContractFailure("logits are finite", f"row {bad} holds inf or nan")


def check_same_rows(got: dict, expected: dict, rule: str, what: str, atol: float) -> None:
    """Every sampled (sequence, position) of ``expected`` has the same row in ``got``: token ids
    exactly, logits within ``atol``. ``what``: the schedule that gave ``got``."""
    if got.keys() != expected.keys():
        raise ContractFailure(rule, f"{what}: sampled positions {sorted(got)} instead of {sorted(expected)}")
    for key, want in expected.items():
        have = got[key]
        if isinstance(want, int):
            if have != want:
                raise ContractFailure(rule, f"{what}: token at {key} is {have}, expected {want}")
        else:
            diff = float((have.float() - want.float()).abs().max())
            if not diff <= atol:
                raise ContractFailure(rule, f"{what}: logits at {key} differ by {diff} (> {atol})")
