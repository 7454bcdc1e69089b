"""The torch executor with ``quantization`` on: batch invariance (chunking, batch-mates, preemption) in
each mode and build, the executor contract (weight-only int8 against HF transformers on the same
dequantized weights), the settings that reach it, and the quality on the embedded model (perplexity on
the benchmark's shipped text and teacher-forced top-1 agreement with bf16, at bounds that every CPU
path meets)."""

from __future__ import annotations

import copy

import pytest
import torch

from hetero_core import ConfigError
from hetero_core.default_plugins.torch_executor import TorchExecutor
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu.int8_linear import Int8Linear
from hetero_core.model.cpu.kernel_int8 import quantize_int8_weight
from hetero_core.testing import ExecutorContract
from tests.model.kernel_builds import kernels_for
from tests.model.paged_batches import PagedSequence
from tests.model.test_batch_invariance import (
    BLOCK_SIZE,
    PROMPT,
    TOTAL,
    _assert_same,
    _prefill_then_decode,
    _Run,
    _tokens,
)
from tests.model.tiny_models import VOCAB, hf_logits


def _options(quantization: str, dtype: str = "bfloat16", **more) -> TorchExecutorOptions:
    return TorchExecutorOptions(
        dtype=dtype,
        quantization=quantization,
        cpu_kernels="compiled",
        prepared_weights_cache=False,
        amx_linears=False,
        **more,
    )


@pytest.fixture(params=["native", "haswell"])
def build_kernels(request, tmp_path_factory, monkeypatch):
    from hetero_core.model.cpu import kernels as cpu_kernels_module

    kernels = kernels_for(request.param, tmp_path_factory.getbasetemp() / "kernel_builds")
    monkeypatch.setattr(cpu_kernels_module, "load_cpu_kernels", lambda required=False, **_: kernels)
    return kernels


@pytest.mark.parametrize("quantization", ["int8", "w8a8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["llama", "qwen2_wide_heads"])
def test_quantized_logits_do_not_depend_on_chunking_batch_mates_or_preemption(
    build_kernels, tiny_model_dirs, make_executor, quantization, dtype, name
):
    model_dir, _ = tiny_model_dirs[name]

    def executor():
        made = make_executor(
            model_dir, num_blocks=128, block_size=BLOCK_SIZE, options=_options(quantization, dtype)
        )
        assert any(isinstance(m, Int8Linear) and m.kernels is build_kernels for m in made.model.modules())
        return made

    token_ids = _tokens(TOTAL, seed=3)
    reference = _Run(executor())
    _prefill_then_decode(reference, PagedSequence(1, token_ids, PROMPT), chunk=PROMPT)
    expected = reference.logits[1]
    for chunk in (1, 5):
        run = _Run(executor())
        _prefill_then_decode(run, PagedSequence(1, token_ids, PROMPT), chunk=chunk)
        _assert_same(run.logits[1], expected)
    run = _Run(executor())
    mates = [PagedSequence(2, _tokens(40, seed=4), 9), PagedSequence(3, _tokens(12, seed=5), 2)]
    _prefill_then_decode(run, PagedSequence(1, token_ids, PROMPT), chunk=7, mates=mates)
    _assert_same(run.logits[1], expected)
    run = _Run(executor())  # preempted after 3 decodes, recomputed
    seq = PagedSequence(1, token_ids, PROMPT)
    run.step([(seq, PROMPT)])
    for _ in range(3):
        run.step([(seq, 1)])
    seq.num_computed, seq.block_table, seq.num_prompt_tokens = 0, [], PROMPT + 3
    _prefill_then_decode(run, seq, chunk=6)
    _assert_same(run.logits[1], expected)


def _dequantized_hf(hf_model, group_size: int):
    """A copy of ``hf_model`` whose linears hold the int8 codes times their scales (fp32)."""
    model = copy.deepcopy(hf_model)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                codes, scale = quantize_int8_weight(module.weight, group_size)
                weight = codes.float().reshape(codes.shape[0], scale.shape[1], -1) * scale[:, :, None]
                module.weight = torch.nn.Parameter(weight.reshape(codes.shape))  # a tied head: untied here
    return model


class TestTorchExecutorContractInt8(ExecutorContract):
    """Weight-only int8 in fp32: greedy equal to HF transformers on the same dequantized weights."""

    vocab_size = VOCAB
    quantization = "int8"

    @pytest.fixture(autouse=True)
    def _tiny_llama(self, tiny_model_dirs):
        self.model_dir, hf_model = tiny_model_dirs["llama"]
        self.hf_model = _dequantized_hf(hf_model, 32)

    def executor_options(self):
        return _options(self.quantization, "float32")

    def make_executor(self, ctx):
        return TorchExecutor(ctx)

    def reference_greedy(self, prompt_token_ids, num_tokens):
        tokens = list(prompt_token_ids)
        for _ in range(num_tokens):
            tokens.append(int(hf_logits(self.hf_model, tokens)[-1].argmax()))
        return tokens[len(prompt_token_ids) :]


class TestTorchExecutorContractW8A8(TestTorchExecutorContractInt8):
    """W8A8 in bf16: the contract's paging and batching checks; greedy deterministic (no HF reference
    quantizes activations)."""

    quantization = "w8a8"

    def executor_options(self):
        return _options(self.quantization, "bfloat16")

    def reference_greedy(self, prompt_token_ids, num_tokens):
        return None


def test_quantization_reaches_the_executor_from_settings_and_refuses_what_it_cannot_do(tiny_model_dirs):
    from hetero_core import LLM

    model_dir = str(tiny_model_dirs["llama"][0])
    llm = LLM(model=model_dir, executor="torch", quantization="w8a8", tokenizer="byte", max_num_blocks=32)
    try:
        linears = [m for m in llm.engine.executor.model.modules() if isinstance(m, Int8Linear)]
        assert linears and {m.activations for m in linears} == {"int8", "float"}  # the LM head weight-only
        assert llm.engine.executor.linear_weight_bytes > 0
    finally:
        llm.shutdown()
    with pytest.raises(ConfigError, match="Input should be 'int8' or 'w8a8'"):
        LLM(model=model_dir, executor="torch", quantization="fp8", tokenizer="byte")
    with pytest.raises(ConfigError, match="executor 'mock' has no quantization option"):
        LLM(executor="mock", quantization="int8")


@pytest.mark.slow
def test_int8_on_the_embedded_model_keeps_its_perplexity_and_top1_choices(smollm2_dir):
    """Measured on a Zen 4: perplexity 13.14 (bf16), 13.26 (int8), 13.29 (w8a8); teacher-forced top-1
    97.5% and 97.0%. The bounds leave room for every CPU path's own rounding."""
    from hetero_bench.quality import perplexity, quality_prompts, quality_text, text_windows
    from hetero_core import LLM, SamplingParams

    scoring = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    results, forced, starts = {}, None, None
    for quantization in (None, "int8", "w8a8"):
        options = {"dtype": "bfloat16", "quantization": quantization, "prepared_weights_cache": False}
        llm = LLM(
            model=str(smollm2_dir), executor={"name": "torch", "torch": options}, enable_prefix_caching=False
        )
        try:
            ids = llm.engine.tokenizer.encode(quality_text())
            windows = [{"prompt_token_ids": w} for w in text_windows(ids, 256)]
            logprobs = [
                e[t].logprob
                for o in llm.generate(windows, scoring, use_tqdm=False)
                for e, t in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])
            ]
            if forced is None:
                outs = llm.generate(quality_prompts()[:8], greedy, use_tqdm=False)
                forced = [
                    {"prompt_token_ids": list(o.prompt_token_ids) + list(o.outputs[0].token_ids)}
                    for o in outs
                ]
                starts = [len(o.prompt_token_ids) for o in outs]
            ranks = [
                e[t].rank
                for o, start in zip(llm.generate(forced, scoring, use_tqdm=False), starts)
                for e, t in zip(o.prompt_logprobs[start:], o.prompt_token_ids[start:])
            ]
        finally:
            llm.shutdown()
        results[quantization] = (perplexity(logprobs), sum(r == 1 for r in ranks) / len(ranks))
    reference, own_top1 = results[None]
    assert own_top1 >= 0.95  # bf16 scoring its own greedy text (prefill vs decode rows: same kernels)
    for quantization in ("int8", "w8a8"):
        ppl, top1 = results[quantization]
        assert ppl <= reference * 1.05, (quantization, ppl, reference)
        assert top1 >= 0.85, (quantization, top1)
