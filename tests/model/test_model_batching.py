"""Mixed batches: prefills, chunked prefills continuing a cached prefix, and decodes together give
the same logits as each sequence processed alone (and as HF)."""

from __future__ import annotations

import pytest
import torch

from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_models import VOCAB, hf_logits

TOL = 1e-4
BLOCK_SIZE = 16


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", ["llama3_rope", "qwen3"])
def test_mixed_batch_matches_hf_and_alone(name, tiny_model_dirs, make_executor):
    model_dir, hf_model = tiny_model_dirs[name]
    a = PagedSequence(1, tokens(45, seed=1), num_prompt_tokens=40)  # prefilled in two chunks
    b = PagedSequence(2, tokens(25, seed=2), num_prompt_tokens=18)
    c = PagedSequence(3, tokens(9, seed=3), num_prompt_tokens=5)
    ref = {seq.seq_id: hf_logits(hf_model, seq.token_ids) for seq in (a, b, c)}
    executor = make_executor(model_dir, block_size=BLOCK_SIZE)
    pool = BlockPool(64, shuffle=True)

    def check(batch, expected_rows):
        logits = executor.execute(batch).logits
        assert logits.shape == (len(expected_rows), VOCAB)
        for row, (seq_id, pos) in enumerate(expected_rows):
            assert (logits[row] - ref[seq_id][pos]).abs().max() < TOL, f"seq {seq_id} position {pos}"
        return logits

    # Step 1: b prefills whole; a prefills its first chunk (not sampled); c prefills.
    check(step([(b, 18), (a, 24), (c, 5)], pool, BLOCK_SIZE), [(2, 17), (3, 4)])
    # Step 2: b decodes, a's chunk continues its 24 cached tokens (sampled), c decodes.
    mixed = check(step([(b, 1), (a, 16), (c, 1)], pool, BLOCK_SIZE), [(2, 18), (1, 39), (3, 5)])
    # Steps 3-5: all decode, across a block boundary for b.
    for k in range(3):
        check(step([(a, 1), (b, 1), (c, 1)], pool, BLOCK_SIZE), [(1, 40 + k), (2, 19 + k), (3, 6 + k)])

    # The same chunk processed alone (fresh executor) gives the same row as in the mixed batch.
    alone_exec = make_executor(model_dir, block_size=BLOCK_SIZE)
    a2, pool2 = PagedSequence(1, a.token_ids, 40), BlockPool(64)
    alone_exec.execute(step([(a2, 24)], pool2, BLOCK_SIZE))
    alone = alone_exec.execute(step([(a2, 16)], pool2, BLOCK_SIZE)).logits
    assert (alone[0] - mixed[1]).abs().max() < TOL


def test_single_token_prefill_chunk_and_many_chunks(tiny_model_dirs, make_executor):
    """Prefill in uneven chunks, the last a single token (it shares the decode group)."""
    model_dir, hf_model = tiny_model_dirs["qwen2"]
    seq = PagedSequence(5, tokens(35, seed=4), num_prompt_tokens=35)
    other = PagedSequence(6, tokens(20, seed=5), num_prompt_tokens=3)
    expected, expected_other = hf_logits(hf_model, seq.token_ids), hf_logits(hf_model, other.token_ids)
    executor = make_executor(model_dir, block_size=BLOCK_SIZE)
    pool = BlockPool(64, shuffle=True, seed=3)
    executor.execute(step([(other, 3)], pool, BLOCK_SIZE))
    for chunk in (7, 16, 11):
        out = executor.execute(step([(seq, chunk), (other, 1)], pool, BLOCK_SIZE)).logits
        assert out.shape == (1, VOCAB)  # seq is not sampled until its prompt is done
        assert (out[0] - expected_other[other.num_computed - 1]).abs().max() < TOL
    out = executor.execute(step([(other, 1), (seq, 1)], pool, BLOCK_SIZE)).logits
    assert (out[0] - expected_other[other.num_computed - 1]).abs().max() < TOL
    assert (out[1] - expected[34]).abs().max() < TOL


def test_recompute_after_preemption_reuses_fresh_blocks(tiny_model_dirs, make_executor):
    """A preempted sequence recomputes prompt + generated tokens into new blocks and continues."""
    model_dir, hf_model = tiny_model_dirs["llama"]
    seq = PagedSequence(9, tokens(30, seed=6), num_prompt_tokens=20)
    expected = hf_logits(hf_model, seq.token_ids)
    executor = make_executor(model_dir, block_size=BLOCK_SIZE)
    pool = BlockPool(64)
    executor.execute(step([(seq, 20)], pool, BLOCK_SIZE))
    executor.execute(step([(seq, 1)], pool, BLOCK_SIZE))
    # Preempted: forget its blocks, recompute all 21 known tokens (prompt + 1 generated) elsewhere.
    seq.num_computed, seq.block_table, seq.num_prompt_tokens = 0, [], 22
    out = executor.execute(step([(seq, 22)], pool, BLOCK_SIZE)).logits
    assert (out[0] - expected[21]).abs().max() < TOL


@pytest.mark.parametrize("name", ["llama", "llama_q4_1"])  # fp32 panels; block codes (q8a_coded_linear)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cpu_kernels", ["auto", "torch"])
def test_a_step_that_samples_no_row_returns_empty_logits(
    tiny_model_dirs, make_executor, name, dtype, cpu_kernels
):
    """A middle chunk of a chunked prefill samples nothing: the last layer's projection, MLP and the LM
    head run on zero rows (they crashed the process with SIGFPE on block-code weights), the K/V of
    every row is written, and the next chunk's logits are right."""
    from hetero_core.default_plugins.torch_options import TorchExecutorOptions

    model_dir, hf_model = tiny_model_dirs[name]
    options = TorchExecutorOptions(dtype=dtype, cpu_kernels=cpu_kernels, prepared_weights_cache=False)
    executor = make_executor(model_dir, options=options)
    seq = PagedSequence(1, tokens(40, seed=7), num_prompt_tokens=40)
    pool = BlockPool(64)
    for chunk in (5, 15):
        out = executor.execute(step([(seq, chunk)], pool, BLOCK_SIZE))
        assert out.logits.shape == (0, VOCAB) and out.logits.dtype == torch.float32
    last = executor.execute(step([(seq, 20)], pool, BLOCK_SIZE)).logits
    expected = hf_logits(hf_model, seq.token_ids)[39]
    # bf16 is rounded (block codes take fp32 activations by default: exact)
    rounded = dtype == "bfloat16"
    assert last.shape == (1, VOCAB) and (last[0] - expected).abs().max() < (0.5 if rounded else TOL)


def test_the_last_layer_runs_its_mlp_on_the_sampled_rows_alone(tiny_model_dirs, make_executor, monkeypatch):
    """A prefill samples one row per prompt: the last layer's output projection and MLP run on those
    rows only; every row's K/V is still written (the decode after it matches HF)."""
    model_dir, hf_model = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, block_size=BLOCK_SIZE)
    mlp_rows = []
    for layer in executor.model.model.layers:
        original = layer.mlp.forward
        monkeypatch.setattr(
            layer.mlp, "forward", lambda x, original=original: mlp_rows.append(len(x)) or original(x)
        )
    a = PagedSequence(1, tokens(31, seed=6), num_prompt_tokens=30)
    b = PagedSequence(2, tokens(13, seed=7), num_prompt_tokens=12)
    expected = {seq.seq_id: hf_logits(hf_model, seq.token_ids) for seq in (a, b)}
    pool = BlockPool(64, shuffle=True)
    logits = executor.execute(step([(a, 30), (b, 12)], pool, BLOCK_SIZE)).logits
    assert mlp_rows == [42, 2]  # two layers: the first over every row, the last over the sampled ones
    assert (logits[0] - expected[1][29]).abs().max() < TOL and (logits[1] - expected[2][11]).abs().max() < TOL
    logits = executor.execute(step([(a, 1), (b, 1)], pool, BLOCK_SIZE)).logits  # reads the last layer's K/V
    assert (logits[0] - expected[1][30]).abs().max() < TOL and (logits[1] - expected[2][12]).abs().max() < TOL
