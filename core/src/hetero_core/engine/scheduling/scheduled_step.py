"""ScheduledStep: one engine step's work, as the scheduler hands it to the engine.

The sequences to run and their new tokens, the batch built from them, the sequences preempted this step,
and the block transfers the executor runs before the batch (swap out, swap in, copy-on-write copies;
``engine/kv/block_transfer.py``). A step may schedule nothing and still carry swap-outs (its
preemptions made room for the next step): the engine applies them at once, so nothing carries over.
``is_stalled`` says that nothing was scheduled and nothing ever will be (see ``Scheduler.schedule``).

Scheduling a sequence advances its ``num_computed_tokens`` at once (as vLLM v1 does): the next step
is planned from there, whether or not this one has run yet (async scheduling). The tokens stay
``num_inflight_tokens`` until the step completes, and a step that samples the sequence's next token
leaves it ``num_pending_tokens`` until the engine knows it. A sequence swapped in by a step has its
swapped K/V in flight too (``swapped_in_tokens``): the copy is the step's, and it may fail; until the
step completes none of its blocks is named in the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hetero_core.engine.kv.kv_allocator import SlotAllocation
from hetero_core.engine.kv.kv_transfer import without_first_blocks
from hetero_core.engine.requests.sequence import Sequence, SequenceStatus
from hetero_core.engine.scheduling.batch import Batch

__all__ = ["ScheduledStep", "StepBuilder", "confirm_swap_ins", "unschedule", "without_seqs"]
PREFILL, DECODE = SequenceStatus.PREFILL, SequenceStatus.DECODE


@dataclass
class ScheduledStep:
    seqs: list[Sequence]
    num_new_tokens: list[int]
    batch: Batch | None  # None when nothing was scheduled
    preempted: list[Sequence] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, swap block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (swap block, device block)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (source, destination), copy-on-write
    is_stalled: bool = False  # nothing scheduled, requests wait, and nothing will change
    kv_epochs: list[int] = field(default_factory=list)  # each sequence's kv_epoch when it was scheduled
    # rows whose input token was not known when the batch was built: the token that the step
    # before samples for that sequence (async scheduling); the engine writes it in before the step runs
    placeholder_rows: list[int] = field(default_factory=list)
    # seq_id -> the confirmed tokens whose K/V this step's swap_in copies back (in flight until it completes)
    swapped_in_tokens: dict[int, int] = field(default_factory=dict)
    # sequences this step swaps out: if its transfers fail their K/V is lost, and they fail with it
    swapped_out: list[Sequence] = field(default_factory=list)
    # (blocks, layers): K/V from another engine written into these blocks after swap-in (kv_transfer.py)
    kv_imports: list[tuple[list[int], object]] = field(default_factory=list)
    kv_imported_tokens: dict[int, int] = field(
        default_factory=dict
    )  # seq_id -> prompt tokens its import counts
    # speculative decoding: each sequence's proposed tokens, run after its last token (None: no proposals)
    spec_token_ids: list[tuple[int, ...]] | None = None

    @property
    def has_transfers(self) -> bool:
        return bool(self.swap_out or self.swap_in or self.block_copies or self.kv_imports)


class StepBuilder:
    """The sequences chosen so far this step, the tokens left, and the block operations."""

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget
        self.num_tokens = 0
        self.seqs: list[Sequence] = []
        self.num_new: list[int] = []
        self.is_prefill: list[bool] = []
        self.sample: list[bool] = []
        self.kv_epochs: list[int] = []
        self.scheduled_ids: set[int] = set()
        self.preempted: list[Sequence] = []
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.block_copies: list[tuple[int, int]] = []
        self.swapped_in_tokens: dict[int, int] = {}
        self.swapped_out: list[Sequence] = []
        self.kv_imports: list[tuple[list[int], object]] = []
        self.kv_imported_tokens: dict[int, int] = {}
        self.spec: list[tuple[int, ...]] = []  # per sequence: its proposals this step (speculative decoding)
        self.num_spec_tokens = 0

    @property
    def chosen(self) -> bool:
        return bool(self.seqs)

    def is_full(self, max_batch_size: int) -> bool:
        return len(self.seqs) == max_batch_size or self.token_budget == 0

    def add(self, seq: Sequence, num_new: int, slots: SlotAllocation, spec: tuple[int, ...] = ()) -> None:
        """Schedule ``num_new`` tokens of ``seq``: its computed (and in-flight) tokens advance now;
        a segment that reaches its last token samples the next one (pending until known). ``spec``:
        proposed tokens, the last ``len(spec)`` of the ``num_new`` (verified by the sampler)."""
        self.seqs.append(seq)
        self.num_new.append(num_new)
        self.kv_epochs.append(seq.kv_epoch)
        self.scheduled_ids.add(seq.seq_id)
        self.token_budget -= num_new
        self.num_tokens += num_new
        if slots.block_copies:
            self.block_copies += slots.block_copies
            seq.block_table_copy = None  # a block was replaced in place
        self.is_prefill.append(seq.status is PREFILL)
        self.spec.append(spec)
        self.num_spec_tokens += len(spec)
        end = seq.num_computed_tokens + num_new
        seq.num_computed_tokens = end
        seq.num_inflight_tokens += num_new
        # num_scheduled_tokens, inline; the proposals follow the last token, whose next one is sampled
        sample = (
            end - len(spec) == len(seq.prompt_token_ids) + len(seq.output_token_ids) + seq.num_pending_tokens
        )
        self.sample.append(sample)
        if sample:
            seq.num_pending_tokens += 1
            seq.status = DECODE

    def add_swap_in(self, seq: Sequence, pairs: list[tuple[int, int]]) -> None:
        """``seq``'s K/V comes back through ``pairs`` (before the batch): its confirmed tokens are in
        flight again until the step completes (a swap-in that fails must leave no named block)."""
        self.swap_in += pairs
        num_confirmed = seq.num_confirmed_tokens
        seq.num_inflight_tokens += num_confirmed
        self.swapped_in_tokens[seq.seq_id] = num_confirmed

    def add_kv_import(self, seq: Sequence, first_block: int) -> None:
        """``seq`` arrived with its prompt's K/V (``seq.kv_import``): blocks from ``first_block`` on (those
        before are prefix-cache hits) are written before the batch; the prompt counts as computed, in
        flight until the step completes (as a swap-in's tokens), and the first token runs as a decode."""
        handoff, seq.kv_import = seq.kv_import, None
        num_prompt = len(seq.prompt_token_ids)
        blocks = seq.block_table[first_block : -(-num_prompt // handoff.blocks.block_size)]
        if blocks:
            layers = [
                tuple(without_first_blocks(t, first_block, handoff.blocks.block_dim) for t in layer)
                for layer in handoff.blocks.layers
            ]
            self.kv_imports.append((blocks, layers))
        num_imported = num_prompt - seq.num_computed_tokens
        seq.num_computed_tokens = num_prompt
        seq.num_inflight_tokens += num_imported
        self.swapped_in_tokens[seq.seq_id] = self.kv_imported_tokens[seq.seq_id] = num_imported
        seq.status = DECODE

    def build(self, batches, earlier: StepBuilder | None = None, is_stalled: bool = False) -> ScheduledStep:
        """The step, its batch from ``batches`` (a ``BatchBuilder``); ``earlier``: a pass of the same
        step that scheduled nothing (its preemptions and swap-outs come first)."""
        preempted, swap_out, swapped_out = self.preempted, self.swap_out, self.swapped_out
        if earlier is not None:
            preempted, swap_out = earlier.preempted + preempted, earlier.swap_out + swap_out
            swapped_out = earlier.swapped_out + swapped_out
        batch, placeholder_rows = batches.build(self) if self.seqs else (None, [])
        return ScheduledStep(
            seqs=self.seqs,
            num_new_tokens=self.num_new,
            batch=batch,
            preempted=preempted,
            swap_out=swap_out,
            swap_in=self.swap_in,
            block_copies=self.block_copies,
            is_stalled=is_stalled,
            kv_epochs=self.kv_epochs,
            placeholder_rows=placeholder_rows,
            swapped_in_tokens=self.swapped_in_tokens,
            swapped_out=swapped_out,
            kv_imports=self.kv_imports,
            kv_imported_tokens=self.kv_imported_tokens,
            spec_token_ids=self.spec if self.num_spec_tokens else None,
        )


@dataclass
class _Rows:
    """Some rows of a step, in the shape ``BatchBuilder.build`` reads."""

    seqs: list[Sequence]
    num_new: list[int]
    is_prefill: list[bool]
    sample: list[bool]
    num_tokens: int
    spec: list[tuple[int, ...]] | None = None
    num_spec_tokens: int = 0


def without_seqs(step: ScheduledStep, seq_ids: set[int], batches) -> ScheduledStep:
    """``step`` without the sequences ``seq_ids`` (which failed before it ran), its batch rebuilt by
    ``batches``; its block transfers stay (they only copy blocks)."""
    keep = [i for i, seq in enumerate(step.seqs) if seq.seq_id not in seq_ids]
    if len(keep) == len(step.seqs):
        return step
    spec = None if step.spec_token_ids is None else [step.spec_token_ids[i] for i in keep]
    rows = _Rows(
        [step.seqs[i] for i in keep],
        [step.num_new_tokens[i] for i in keep],
        [step.batch.is_prefill[i] for i in keep],
        [step.batch.sample[i] for i in keep],
        sum(step.num_new_tokens[i] for i in keep),
        spec,
        sum(map(len, spec or ())),
    )
    batch, placeholder_rows = batches.build(rows) if keep else (None, [])
    return replace(
        step,
        seqs=rows.seqs,
        num_new_tokens=rows.num_new,
        batch=batch,
        kv_epochs=[step.kv_epochs[i] for i in keep],
        placeholder_rows=placeholder_rows,
        spec_token_ids=spec if rows.num_spec_tokens else None,
    )


def confirm_swap_ins(step: ScheduledStep) -> None:
    """``step`` completed: the K/V its swap-ins copied back is confirmed again."""
    swapped_in = step.swapped_in_tokens
    for seq, epoch in zip(step.seqs, step.kv_epochs):
        num_tokens = swapped_in.get(seq.seq_id)
        if num_tokens and not seq.status.is_done and seq.kv_epoch == epoch:
            seq.num_inflight_tokens -= num_tokens


def unschedule(step: ScheduledStep) -> None:
    """Undo what scheduling ``step`` advanced, for a step that was interrupted before it ran (its
    blocks stay allocated and are used when the tokens are scheduled again; a prompt whose K/V this
    step was to import is prefilled instead)."""
    if step.batch is None:
        return
    for seq, num_new, epoch, was_prefill, sample in zip(
        step.seqs, step.num_new_tokens, step.kv_epochs, step.batch.is_prefill, step.batch.sample
    ):
        if seq.status.is_done or seq.kv_epoch != epoch:
            continue
        seq.num_computed_tokens -= num_new
        seq.num_inflight_tokens -= num_new
        if sample:
            seq.num_pending_tokens -= 1
            if was_prefill:
                seq.status = PREFILL
        num_imported = step.kv_imported_tokens.get(seq.seq_id)
        if num_imported is not None:  # the import may not have run: the rest of the prompt is prefilled here
            seq.num_computed_tokens -= num_imported
            seq.num_inflight_tokens -= num_imported
            seq.status = PREFILL
