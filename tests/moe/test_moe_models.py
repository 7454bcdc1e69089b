"""Qwen3-MoE, Qwen2-MoE and Mixtral through the torch executor give transformers' logits and greedy
tokens: prefill and decode over shuffled paged blocks, in the model code's torch path and with the
CPU kernels (packed experts); a few hundred greedy tokens through the engine with chunked prefill and
preemption (the architecture kit, ``test_moe_architecture_contract``, adds the executor contract).
All in fp32: routing picks the top-k of probabilities, so differently rounded logits (bf16) can pick
another expert near a tie and the tokens then part ways (bf16 is checked for what it promises: the
kernels' batch invariance, ``test_moe_batch_invariance``)."""

from __future__ import annotations

import pytest
import torch

from hetero_core.builder import build_engine
from hetero_core.default_plugins.torch_executor import TorchExecutor
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.executor import ExecutorContext
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.moe.tiny_moe_models import TINY_MOE_MODELS, VOCAB

TOL = 1e-4
BLOCK_SIZE = 16


def make_executor(
    model_dir, cpu_kernels: str, num_blocks: int = 64, block_size: int = BLOCK_SIZE
) -> TorchExecutor:
    options = TorchExecutorOptions(dtype="float32", cpu_kernels=cpu_kernels, prepared_weights_cache=False)
    ctx = ExecutorContext(
        settings=None,
        options=options,
        model_dir=model_dir,
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=1024,
        max_num_batched_tokens=1024,
        max_num_seqs=16,
        eos_token_id=None,
        vocab_size=0,
    )
    return TorchExecutor(ctx)


def require_cpu_kernels():
    from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels

    try:
        load_cpu_kernels(required=True)
    except KernelUnavailable as exc:
        pytest.skip(f"the CPU kernels cannot be built here: {exc}")


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("name", list(TINY_MOE_MODELS))
@pytest.mark.parametrize("cpu_kernels", ["torch", "compiled"])
def test_prefill_then_decode_matches_hf(name, cpu_kernels, tiny_moe_dirs):
    if cpu_kernels == "compiled":
        require_cpu_kernels()
    model_dir, hf_model = tiny_moe_dirs[name]
    executor = make_executor(model_dir, cpu_kernels)
    if cpu_kernels == "compiled":
        from hetero_core.model.cpu.packed_experts import PackedExperts

        assert any(isinstance(m, PackedExperts) for m in executor.model.modules())
    num_prompt, num_decode = 37, 12
    tokens = torch.randint(
        0, VOCAB, (num_prompt + num_decode,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    expected = hf_logits(hf_model, tokens)
    seq, pool = (
        PagedSequence(seq_id=7, token_ids=tokens, num_prompt_tokens=num_prompt),
        BlockPool(64, shuffle=True),
    )
    logits = executor.execute(step([(seq, num_prompt)], pool, BLOCK_SIZE)).logits
    assert (logits[0] - expected[num_prompt - 1]).abs().max() < TOL
    for position in range(num_prompt, num_prompt + num_decode):
        logits = executor.execute(step([(seq, 1)], pool, BLOCK_SIZE)).logits
        assert (logits[0] - expected[position]).abs().max() < TOL, f"decode at position {position}"
    executor.shutdown()


PROMPTS = [
    [5, 17, 33, 2, 48, 71, 9, 64, 12, 88, 40, 3, 27, 55, 61, 19, 7, 90, 14, 36][: 8 + 3 * i] for i in range(4)
]


def hf_greedy(hf_model, prompt: list[int], num_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("name", list(TINY_MOE_MODELS))
def test_hundreds_of_greedy_tokens_match_hf_with_chunked_prefill_and_preemption(name, tiny_moe_dirs):
    model_dir, hf_model = tiny_moe_dirs[name]
    num_tokens = 240
    settings = load_settings(
        model=str(model_dir),
        tokenizer="byte",
        block_size=4,
        max_model_len=512,
        max_num_blocks=160,
        memory_threshold=1.0,
        max_prefill_chunk=5,
        dtype="float32",
        executor={"name": "torch", "torch": {"dtype": "float32", "prepared_weights_cache": False}},
    )
    engine = build_engine(settings, load_plugins(entry_points=[]))
    try:
        outputs = engine.generate(
            PROMPTS, SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
        )
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert stats.num_preemptions > 0  # 4 x ~250 tokens in 160 blocks of 4
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        assert list(output.output_token_ids) == hf_greedy(hf_model, prompt, num_tokens)


def test_decode_graphs_leave_a_moe_model_eager(tiny_moe_dirs):
    """Each MoE layer reads its experts' token counts on the host: no CUDA graph can hold that."""
    from hetero_core.model.decode_graphs import build_decode_graphs

    executor = make_executor(tiny_moe_dirs["mixtral"][0], "torch")
    assert build_decode_graphs(executor.runner, scratch_block=63, max_num_seqs=4, max_model_len=64) is None
    executor.shutdown()
