"""MockExecutor: deterministic tokens from (seed, prompt tokens, position), through a real paged cache.

The "KV cache" holds token ids: every scheduled token is written to its slot, and the prompt is
read back through the block table, exactly as attention would read K/V. A scheduler bug (wrong slot,
stale block table, lost prefix) therefore changes the output, so tests catch it. The token at a
position depends only on the seed, the prompt and the position: not on the batch, the block size or
preemption.
"""

from __future__ import annotations

import hashlib
import struct
import time
from array import array

from hetero_core import ConfigError
from hetero_core.executor import Batch, ExecutorCapabilities, ExecutorContext, ExecutorOutput, slot_of
from hetero_core.kv_transfer import KVTensor
from hetero_core.structured_output import allowed_token_ids
from hetero_plugins_mock.options import MockExecutorOptions

EMPTY_SLOT = -1


class BatchInconsistency(RuntimeError):
    """The batch broke a paged-cache invariant (a scheduler bug)."""


class MockExecutor:
    def __init__(self, ctx: ExecutorContext) -> None:
        self.options: MockExecutorOptions = ctx.options or MockExecutorOptions()
        if self.options.vocab_size > ctx.vocab_size:
            raise ConfigError(
                f"executor.mock.vocab_size ({self.options.vocab_size}) exceeds the tokenizer's "
                f"vocabulary ({ctx.vocab_size})"
            )
        self.eos_token_id = ctx.eos_token_id
        self.vocab_size = ctx.vocab_size
        self.block_size = ctx.block_size
        self.num_blocks = ctx.num_blocks
        self.slots = array("q", [EMPTY_SLOT]) * (ctx.num_blocks * ctx.block_size)
        self.swap_slots = array("q", [EMPTY_SLOT]) * (ctx.num_swap_blocks * ctx.block_size)
        # token ids (no logits, so no prompt logits); 1 + n token ids per sequence with batch.num_spec_tokens;
        # every block transfer; exported blocks are one (blocks, block_size) tensor: blocks along dim 0
        self.capabilities = ExecutorCapabilities(
            vocab_size=ctx.vocab_size,
            supports_speculative_decoding=True,
            block_copy=True,
            block_swap=True,
            kv_export=True,
            kv_import=True,
            kv_block_dim=0,
        )

    def execute(self, batch: Batch) -> ExecutorOutput:
        self._check(batch)
        for slot, token in zip(batch.slot_mapping, batch.token_ids):
            self.slots[slot] = token
        token_ids = [self._next_token(batch, i) for i in batch.sample_indices]
        if batch.token_bitmask is not None:  # structured output: only tokens the mask allows
            token_ids = [
                self._allowed_token(batch.token_bitmask[row], token, batch.context_lens[i])
                for row, (i, token) in enumerate(zip(batch.sample_indices, token_ids))
            ]
        if (
            batch.num_spec_tokens is not None
        ):  # verify proposals: its token at each of the last 1 + n positions
            token_ids = self._with_proposal_rows(batch, token_ids)
        self._simulate_latency(batch)
        return ExecutorOutput(token_ids=token_ids)

    def _with_proposal_rows(self, batch: Batch, token_ids: list[int]) -> list[int]:
        """The rows of a batch with proposals: a speculating sequence's token after each of its last
        ``1 + n`` positions (it never has a grammar), the others' one token as computed."""
        rows = []
        for token, i in zip(token_ids, batch.sample_indices):
            n, end = batch.num_spec_tokens[i], batch.context_lens[i]
            rows += (
                [self._next_token(batch, i, position) for position in range(end - n, end + 1)]
                if n
                else [token]
            )
        return rows

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks (copy-on-write): ``(source, destination)`` pairs."""
        self._copy(self.slots, self.slots, pairs, "copy_blocks", self.num_blocks, self.num_blocks)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to swap blocks: ``(device block, swap block)`` pairs."""
        self._copy(self.slots, self.swap_slots, pairs, "swap_out", self.num_blocks, self._num_swap_blocks)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy swap blocks back to device blocks: ``(swap block, device block)`` pairs."""
        self._copy(self.swap_slots, self.slots, pairs, "swap_in", self._num_swap_blocks, self.num_blocks)

    def export_blocks(self, block_ids: list[int]) -> list[tuple[KVTensor, ...]]:
        """Whole blocks for a KV transfer: one "layer" of one int64 tensor (blocks x block_size) of
        the token ids the slots hold."""
        bs, data = self.block_size, array("q")
        for block in block_ids:
            if not 0 <= block < self.num_blocks:
                raise BatchInconsistency(f"export_blocks: block {block} outside the pool")
            data.extend(self.slots[block * bs : (block + 1) * bs])
        return [(KVTensor("int64", (len(block_ids), bs), data.tobytes()),)]

    def import_blocks(self, block_ids: list[int], layers: list[tuple[KVTensor, ...]]) -> None:
        """Write blocks ``export_blocks`` produced (of a mock of the same block size) into ``block_ids``."""
        bs = self.block_size
        if (
            len(layers) != 1
            or len(layers[0]) != 1
            or layers[0][0].dtype != "int64"
            or tuple(layers[0][0].shape) != (len(block_ids), bs)
        ):
            raise ValueError(
                f"the mock executor imports one int64 tensor of shape ({len(block_ids)}, {bs}), got "
                f"{[[(t.dtype, tuple(t.shape)) for t in layer] for layer in layers]}"
            )
        data = array("q")
        data.frombytes(bytes(layers[0][0].data))
        for i, block in enumerate(block_ids):
            if not 0 <= block < self.num_blocks:
                raise BatchInconsistency(f"import_blocks: block {block} outside the pool")
            self.slots[block * bs : (block + 1) * bs] = data[i * bs : (i + 1) * bs]

    def shutdown(self) -> None:
        self.slots = array("q")
        self.swap_slots = array("q")

    @property
    def _num_swap_blocks(self) -> int:
        return len(self.swap_slots) // self.block_size

    def _copy(
        self, source: array, destination: array, pairs, what: str, num_source: int, num_destination: int
    ):
        bs = self.block_size
        for src, dst in pairs:
            if not (0 <= src < num_source and 0 <= dst < num_destination):
                raise BatchInconsistency(f"{what}: block pair ({src}, {dst}) outside the pools")
            destination[dst * bs : (dst + 1) * bs] = source[src * bs : (src + 1) * bs]

    def _next_token(self, batch: Batch, i: int, position: int | None = None) -> int:
        """Sequence ``i``'s token at ``position`` (default: the one being produced, ``context_lens[i]``)."""
        opts = self.options
        prompt = self._read_context(batch.block_tables[i], batch.num_prompt_tokens[i])
        position = batch.context_lens[i] if position is None else position
        output_index = position - batch.num_prompt_tokens[i]  # 0 for the first output token
        seed = batch.seeds[i] if batch.seeds[i] is not None else 0
        digest = hashlib.blake2b(
            struct.pack("<qqq", _seed_word(opts.seed), _seed_word(seed), position) + prompt.tobytes(),
            digest_size=16,
        ).digest()
        value, chance = struct.unpack("<QQ", digest)
        if self.eos_token_id is not None:
            if opts.eos_after is not None and output_index + 1 >= opts.eos_after:
                return self.eos_token_id
            if chance / 2**64 < opts.eos_probability:
                return self.eos_token_id
        return opts.first_token_id + value % (opts.vocab_size - opts.first_token_id)

    def _allowed_token(self, row_words, token: int, position: int) -> int:
        """Structured output: EOS once the grammar allows it (so a walk ends), else ``token`` if the
        row's mask allows it, else an allowed one picked by a hash of ``token`` and the position: as
        deterministic as any other output. An unconstrained row (all bits set) keeps ``token``."""
        words = row_words.tolist()
        if all(word == -1 for word in words):
            return token
        allowed = allowed_token_ids(words, self.vocab_size)
        if not allowed:
            return token  # nothing is allowed: the engine fails the request
        if self.eos_token_id in allowed:
            return self.eos_token_id
        if token in allowed:
            return token
        return allowed[(token * 2654435761 + position) % len(allowed)]

    def _read_context(self, block_table: list[int], num_tokens: int) -> array:
        bs = self.block_size
        tokens = array("q")
        for block_index in range(-(-num_tokens // bs)):
            start = block_table[block_index] * bs
            tokens.extend(self.slots[start : start + min(bs, num_tokens - block_index * bs)])
        if EMPTY_SLOT in tokens:
            raise BatchInconsistency("prompt read through the block table hits an unwritten slot")
        return tokens

    def _check(self, batch: Batch) -> None:
        """Invariants a real paged executor relies on; violations are scheduler bugs."""
        bs = batch.block_size
        if len(set(batch.slot_mapping)) != len(batch.slot_mapping):
            raise BatchInconsistency("two tokens of one step write the same slot")
        for i in range(batch.num_seqs):
            start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
            table = batch.block_tables[i]
            if len(table) * bs < batch.context_lens[i]:
                raise BatchInconsistency(f"sequence {batch.seq_ids[i]}: block table too short")
            expected = range(batch.num_computed_tokens(i), batch.context_lens[i])
            if list(batch.positions[start:end]) != list(expected):
                raise BatchInconsistency(f"sequence {batch.seq_ids[i]}: positions not contiguous")
            for pos, slot in zip(batch.positions[start:end], batch.slot_mapping[start:end]):
                if slot != slot_of(table, pos, bs):
                    raise BatchInconsistency(f"sequence {batch.seq_ids[i]}: slot outside its blocks")

    def _simulate_latency(self, batch: Batch) -> None:
        opts = self.options
        seconds = opts.prefill_latency_per_token * sum(
            batch.query_len(i) for i in range(batch.num_seqs) if batch.is_prefill[i]
        )
        if not all(batch.is_prefill):
            seconds += opts.decode_latency_per_step
        if seconds:
            time.sleep(seconds)


def _seed_word(seed: int) -> int:
    """A signed 64-bit word for any Python int: seeds in range as they are (outputs stay the same),
    others (2**64, -2**70, ...) through a hash of their decimal digits."""
    if -(2**63) <= seed < 2**63:
        return seed
    digest = hashlib.blake2b(str(seed).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)
