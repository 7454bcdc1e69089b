"""The engine on the cuda executor (flash-attn test double, CPU fp32) gives the torch executor's
greedy tokens, with CUDA graphs (emulated here) and without; and the plugin's face: light import,
registration with its options, one clear message where CUDA or flash-attn is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import PluginError
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.plugin_system.hookspecs import hookimpl
from hetero_core.settings import load_settings
from hetero_plugins_cuda.executor import CudaExecutor
from hetero_plugins_cuda.options import CudaExecutorOptions
from tests.cuda.flash_attn_double import FlashAttnDouble
from tests.cuda.step_plans import TOKENS

PROMPTS = [TOKENS[:37], TOKENS[5:12], TOKENS[20:90], TOKENS[40:41], TOKENS[3:60]]


class DoubleCudaPlugin:
    """Registers 'cuda' as the real plugin does, but on the test double (any device)."""

    def __init__(self):
        self.double = FlashAttnDouble(page_block_multiple=16, dtypes=(__import__("torch").float32,))

    @hookimpl
    def register_executors(self, register):
        register(
            "cuda",
            lambda ctx: CudaExecutor(ctx, kernels=self.double.kernels()),
            options=CudaExecutorOptions,
            needs_model=True,
        )


def greedy_tokens(model_dir, executor: dict, plugins, **extra) -> list[list[int]]:
    settings = load_settings(
        model=str(model_dir),
        tokenizer="byte",
        executor=executor,
        block_size=16,
        max_num_blocks=40,
        max_batch_size=4,
        max_model_len=160,
        max_total_tokens=48,
        **extra,
    )
    engine = build_engine(settings, plugins)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 20, 9, 16, 14)]
    outputs = engine.generate(PROMPTS, params)
    engine.shutdown()
    return [o.output_token_ids for o in outputs]


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_greedy_tokens_equal_the_torch_executors(cuda_graphs, tiny_dirs):
    model_dir, _ = tiny_dirs["llama"]
    torch_fp32 = {"name": "torch", "torch": {"dtype": "float32"}}  # auto: bf16 on some CPUs
    expected = greedy_tokens(model_dir, torch_fp32, load_plugins(entry_points=[]))
    plugin = DoubleCudaPlugin()
    cuda = {"name": "cuda", "cuda": {"device": "cpu", "dtype": "float32", "cuda_graphs": cuda_graphs}}
    got = greedy_tokens(model_dir, cuda, load_plugins(entry_points=[], extra_plugins=[("cuda", plugin)]))
    assert got == expected
    assert [len(t) for t in got] == [12, 20, 9, 16, 14]
    assert plugin.double.calls["with_kvcache"] > 0 and plugin.double.calls["varlen_paged"] > 0


def test_speculative_decoding_keeps_the_torch_executors_greedy_tokens(tiny_dirs):
    """Verification rows (1 + n per speculating sequence) on the cuda executor: never a decode graph."""
    model_dir, _ = tiny_dirs["llama"]
    expected = greedy_tokens(
        model_dir, {"name": "torch", "torch": {"dtype": "float32"}}, load_plugins(entry_points=[])
    )
    plugin = DoubleCudaPlugin()
    cuda = {"name": "cuda", "cuda": {"device": "cpu", "dtype": "float32", "cuda_graphs": True}}
    ngram = {"name": "ngram", "ngram": {"prompt_lookup_min": 1}}  # a random model repeats little
    plugins = load_plugins(entry_points=[], extra_plugins=[("cuda", plugin)])
    engine_kw = dict(num_speculative_tokens=3, speculative_proposer=ngram)
    assert greedy_tokens(model_dir, cuda, plugins, **engine_kw) == expected


def test_the_package_imports_without_torch_and_registers_cuda_with_its_options():
    code = "import sys, hetero_plugins_cuda; print('torch' in sys.modules, 'flash_attn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    import hetero_plugins_cuda

    registry = load_plugins(entry_points=[], extra_plugins=[("cuda", hetero_plugins_cuda)]).registry
    component = registry.get("executor", "cuda")
    assert component.options is CudaExecutorOptions and component.traits["needs_model"]


def test_missing_cuda_or_flash_attn_is_one_clear_message():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    import hetero_plugins_cuda

    plugins = load_plugins(entry_points=[], extra_plugins=[("cuda", hetero_plugins_cuda)])
    with pytest.raises(PluginError) as info:
        build_engine(load_settings(executor="cuda"), plugins)
    message = str(info.value)
    assert message.startswith("executor 'cuda' cannot run here: no CUDA device is visible to torch")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        assert (
            "flash-attn is not installed (pip install 'hetero-plugins-cuda[flash-attn]' --no-build-isolation"
            in message
        )
