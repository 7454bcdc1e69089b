"""KV export/import on the GPU executors' runner (``PagedKVCache`` on the cuda executor's layout): a
prompt prefilled by one engine and decoded by another gives one engine's greedy tokens, with and without
CUDA graphs (the flash-attn test double here, on the CPU; on a GPU machine also the torch executor on
``cuda``). Blocks from an executor of another layout are refused by name."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.kv_transfer import KVHandoff
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from tests.cuda.step_plans import TOKENS
from tests.cuda.test_cuda_engine import DoubleCudaPlugin

PROMPTS = [TOKENS[:37], TOKENS[5:12], TOKENS[20:90], TOKENS[40:41]]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def make_engine(model_dir, executor: dict, plugins, **overrides):
    settings = load_settings(
        model=str(model_dir),
        tokenizer="byte",
        executor=executor,
        block_size=16,
        max_num_blocks=40,
        max_batch_size=4,
        max_model_len=160,
        max_total_tokens=48,
        **overrides,
    )
    return build_engine(settings, plugins)


def run_until(engine, request_id):
    while True:
        for out in engine.step():
            if out.request_id == request_id and out.finished:
                return out


def pair(prefill, decode, prompt):
    first = run_until(prefill, prefill.add_request(prompt, replace(GREEDY, max_tokens=1), export_kv=True))
    assert first.error is None, first.error
    return run_until(
        decode,
        decode.add_request(prompt, GREEDY, kv_transfer=KVHandoff(first.output_token_ids[0], first.kv_blocks)),
    )


def executors():
    double = DoubleCudaPlugin()
    plugins = load_plugins(entry_points=[], extra_plugins=[("cuda", double)])
    cases = [
        (
            {"name": "cuda", "cuda": {"device": "cpu", "dtype": "float32", "cuda_graphs": graphs}},
            plugins,
            f"double-graphs-{graphs}",
        )
        for graphs in (True, False)
    ]
    if torch.cuda.is_available():
        cases.append(
            (
                {"name": "torch", "torch": {"device": "cuda", "dtype": "bfloat16"}},
                load_plugins(entry_points=[]),
                "torch-cuda-bf16",
            )
        )
    return cases


@pytest.mark.parametrize("executor, plugins", [c[:2] for c in executors()], ids=[c[2] for c in executors()])
def test_prefill_here_decode_there_gives_one_engines_tokens(tiny_dirs, executor, plugins):
    model_dir, _ = tiny_dirs["llama"]
    single = make_engine(model_dir, executor, plugins)
    expected = [o.output_token_ids for o in single.generate(PROMPTS, GREEDY)]
    prefill = make_engine(model_dir, executor, plugins)
    decode = make_engine(model_dir, executor, plugins, enable_prefix_caching=True)
    for _ in range(2):  # the second round: the decode engine's prefix cache holds the full blocks
        assert [pair(prefill, decode, p).output_token_ids for p in PROMPTS] == expected
    for engine in (single, prefill, decode):
        engine.shutdown()


def test_blocks_of_another_layout_are_refused_by_name(tiny_dirs):
    model_dir, _ = tiny_dirs["llama"]
    torch_engine = make_engine(
        model_dir, {"name": "torch", "torch": {"dtype": "float32"}}, load_plugins(entry_points=[])
    )
    cuda_case = executors()[1]
    cuda_engine = make_engine(model_dir, cuda_case[0], cuda_case[1])
    out = pair(torch_engine, cuda_engine, PROMPTS[0])
    assert out.error is not None and "same model, dtype and block size" in out.error
