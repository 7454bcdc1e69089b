"""Pure decode steps run every decoder layer in one kernel call (``fused_decode``): the same
logits and KV cache as the layer-by-layer model code, bit for bit, in fp32 and bf16; other steps
and models it cannot run take the model code."""

from __future__ import annotations

import pytest
import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu.fused_decode import FusedDecode
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_models import VOCAB

BLOCK_SIZE = 16
FP32 = {"dtype": "float32", "prepared_weights_cache": False}


def _tokens(n: int, seed: int, vocab: int = VOCAB) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def fused_calls(monkeypatch):
    """Every FusedDecode call's outcome: True where it ran the step, False where it declined."""
    outcomes = []
    original = FusedDecode.__call__

    def spy(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        outcomes.append(result is not None)
        return result

    monkeypatch.setattr(FusedDecode, "__call__", spy)
    return outcomes


def _run_both(model_dir, make_executor, steps_of, dtype: str = "float32", **more_options):
    """The same steps through an executor with the fused path and one without; each step's logits
    from both, and both executors."""
    options = {**FP32, "dtype": dtype, **more_options}
    fused = make_executor(model_dir, block_size=BLOCK_SIZE, options=TorchExecutorOptions(**options))
    plain = make_executor(
        model_dir, block_size=BLOCK_SIZE, options=TorchExecutorOptions(**options, fused_decode=False)
    )
    assert fused.model.fused_decode is not None and plain.model.fused_decode is None
    results = []
    for executor in (fused, plain):
        pool = BlockPool(64, shuffle=True, seed=4)
        results.append([executor.execute(batch).logits for batch in steps_of(pool)])
    return results, fused, plain


def _decode_steps(vocab: int = VOCAB):
    def steps_of(pool):
        seqs = [
            PagedSequence(i, _tokens(n + 6, seed=i, vocab=vocab), num_prompt_tokens=n)
            for i, n in enumerate([3, 17, 30])
        ]
        yield step([(s, s.num_prompt_tokens) for s in seqs], pool, BLOCK_SIZE)  # prefills: the model code
        yield step([(seqs[0], 1), (seqs[1], 1)], pool, BLOCK_SIZE)  # two decodes (seq 2 waits)
        for _ in range(4):  # all three decode, seq 1 crossing a block boundary
            yield step([(s, 1) for s in seqs], pool, BLOCK_SIZE)

    return steps_of


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["llama_wide_heads", "qwen2_wide_heads"])
def test_fused_decode_steps_equal_the_layer_by_layer_model(
    name, dtype, tiny_model_dirs, make_executor, cpu_kernels, fused_calls
):
    model_dir, _ = tiny_model_dirs[name]
    (fused, plain), fused_executor, plain_executor = _run_both(
        model_dir, make_executor, _decode_steps(), dtype
    )
    assert fused_calls == [False, True, True, True, True, True]  # the prefill step declined, decodes fused
    for step_logits, expected in zip(fused, plain, strict=True):
        assert torch.equal(step_logits, expected)
    for ours, theirs in zip(fused_executor.kv_caches, plain_executor.kv_caches, strict=True):
        assert torch.equal(ours.key, theirs.key) and torch.equal(ours.value, theirs.value)


def test_mixed_steps_take_the_model_code(tiny_model_dirs, make_executor, cpu_kernels, fused_calls):
    model_dir, _ = tiny_model_dirs["llama_wide_heads"]

    def steps_of(pool):
        a = PagedSequence(1, _tokens(40, seed=1), num_prompt_tokens=30)
        b = PagedSequence(2, _tokens(20, seed=2), num_prompt_tokens=4)
        yield step([(b, 4)], pool, BLOCK_SIZE)
        yield step([(b, 1), (a, 30)], pool, BLOCK_SIZE)  # a decode beside a prefill
        yield step([(a, 1), (b, 1)], pool, BLOCK_SIZE)

    (fused, plain), _, _ = _run_both(model_dir, make_executor, steps_of)
    assert fused_calls == [False, False, True]
    assert all(torch.equal(x, y) for x, y in zip(fused, plain, strict=True))


def test_the_fused_path_applies_only_where_every_piece_is_a_kernel(
    tiny_model_dirs, make_executor, cpu_kernels
):
    wide, _ = tiny_model_dirs["llama_wide_heads"]
    bf16 = make_executor(wide, options=TorchExecutorOptions(dtype="bfloat16", prepared_weights_cache=False))
    assert (
        bf16.model.fused_decode is not None
    )  # bf16_linear on every CPU (widened where AVX-512 BF16 is missing)
    unpacked = make_executor(wide, options=TorchExecutorOptions(**FP32, prepack_weights=False))
    assert unpacked.model.fused_decode is None  # plain torch linears
    qwen3, _ = tiny_model_dirs["qwen3"]  # q/k norms: no kernel of the fused step
    assert make_executor(qwen3, options=TorchExecutorOptions(**FP32)).model.fused_decode is None
    narrow_heads, _ = tiny_model_dirs["llama"]  # heads of 16 dims: RoPE's 8-wide halves are one vector's tail
    assert make_executor(narrow_heads, options=TorchExecutorOptions(**FP32)).model.fused_decode is not None
    torch_only = make_executor(wide, options=TorchExecutorOptions(**FP32, cpu_kernels="torch"))
    assert torch_only.model.fused_decode is None


@pytest.mark.parametrize(
    "dtype, code_activations", [("float32", "float"), ("float32", "int8"), ("bfloat16", "int8")]
)
def test_a_gguf_of_mixed_types_decodes_fused_through_its_split_linears(
    dtype, code_activations, tmp_path, make_executor, cpu_kernels, fused_calls
):
    """A Q4_K_M-style mix: q/k/v and gate/up whose parts keep codes of different layouts (SplitLinear)
    run part by part inside the fused step, a split gate/up then the kernels' SiLU-and-multiply:
    the model code's logits and KV cache, bit for bit, every decode fused."""
    from hetero_core.model.cpu.split_linear import SplitLinear
    from hetero_core.model.gguf_cache import ensure_gguf_converted
    from tests.model.gguf_files import mixed_types, write_mixed_gguf

    gguf_path = write_mixed_gguf(tmp_path / "mixed.gguf", mixed_types())
    model_dir = ensure_gguf_converted(gguf_path, tmp_path / "cache")
    (fused, plain), fused_executor, plain_executor = _run_both(
        model_dir, make_executor, _decode_steps(vocab=256), dtype, code_activations=code_activations
    )
    layer = fused_executor.model.model.layers[1]
    assert isinstance(layer.self_attn.qkv_proj, SplitLinear)
    assert isinstance(layer.mlp.gate_up_proj, SplitLinear)
    assert fused_calls == [False, True, True, True, True, True]
    for step_logits, expected in zip(fused, plain, strict=True):
        assert torch.isfinite(expected).all() and torch.equal(step_logits, expected)
    for ours, theirs in zip(fused_executor.kv_caches, plain_executor.kv_caches, strict=True):
        assert torch.equal(ours.key, theirs.key) and torch.equal(ours.value, theirs.value)


@pytest.mark.slow
def test_the_embedded_model_decodes_fused_with_identical_logits(
    smollm2_dir, make_executor, cpu_kernels, fused_calls
):
    """SmolLM2's block-code linears (Q4_1 layers, the Q8_0 head) through the fused path."""
    (fused, plain), _, _ = _run_both(smollm2_dir, make_executor, _decode_steps(vocab=49152))
    assert fused_calls.count(True) == 5
    assert all(torch.equal(x, y) for x, y in zip(fused, plain, strict=True))
