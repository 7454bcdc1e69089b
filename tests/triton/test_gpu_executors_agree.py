"""The GPU executors give the same greedy tokens through the whole engine, in float32: torch (eager,
and on a GPU from decode CUDA graphs), triton (decode graphs) and cuda (decode graphs, on the flash-attn
test double). On a GPU everything runs there; on a CPU machine triton runs in its interpreter, cuda's
double and torch on the CPU (graphs emulated), so the wiring is checked everywhere. Each also with
speculative decoding (ngram proposals verified in the same pass), which must not change a token."""

from __future__ import annotations

import pytest

import hetero_plugins_triton
from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.executor import hookimpl
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from tests.cuda.flash_attn_double import FlashAttnDouble  # noqa: E402
from tests.model.tiny_models import save_tiny_model

PROMPTS = [list(range(3, 30)), [5, 9, 2, 77, 41] * 5, [44, 45], list(range(60, 20, -1))]
MAX_TOKENS = (9, 6, 12, 7)


class DoubleCudaPlugin:
    """'cuda' on the flash-attn test double, on any device."""

    @hookimpl
    def register_executors(self, register):
        import torch

        from hetero_plugins_cuda.executor import CudaExecutor
        from hetero_plugins_cuda.options import CudaExecutorOptions

        double = FlashAttnDouble(page_block_multiple=16, dtypes=(torch.float32,))
        register(
            "cuda",
            lambda ctx: CudaExecutor(ctx, kernels=double.kernels()),
            options=CudaExecutorOptions,
            needs_model=True,
        )


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpu_agree") / "qwen3"
    save_tiny_model("qwen3", directory)
    return directory


def greedy_tokens(model_dir, executor: dict, **extra) -> list[list[int]]:
    settings = load_settings(
        model=str(model_dir),
        tokenizer="byte",
        executor=executor,
        block_size=16,
        max_model_len=128,
        max_num_blocks=48,
        max_batch_size=4,
        max_total_tokens=64,
        **extra,
    )
    plugins = load_plugins(
        entry_points=[], extra_plugins=[("triton", hetero_plugins_triton), ("cuda", DoubleCudaPlugin())]
    )
    engine = build_engine(settings, plugins)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    try:
        return [o.output_token_ids for o in engine.generate(PROMPTS, params)]
    finally:
        engine.shutdown()


def test_torch_triton_and_cuda_executors_agree(tiny_qwen3, mode):
    device = str(mode.device)
    expected = greedy_tokens(tiny_qwen3, {"name": "torch", "torch": {"device": device, "dtype": "float32"}})
    assert [len(t) for t in expected] == list(MAX_TOKENS)
    runs = {
        "triton": {
            "name": "triton",
            "triton": {"interpreter": mode.interpret, "device": device, "dtype": "float32"},
        },
        "cuda": {"name": "cuda", "cuda": {"device": device, "dtype": "float32", "cuda_graphs": True}},
    }
    if not mode.interpret:  # the torch executor captures decode graphs on a GPU only
        runs["torch (CUDA graphs)"] = {
            "name": "torch",
            "torch": {"device": device, "dtype": "float32", "cuda_graphs": True},
        }
    for name, executor in runs.items():
        assert greedy_tokens(tiny_qwen3, executor) == expected, name
    # speculative decoding: verification rows (1 + n per speculating sequence) on every executor
    ngram = {"name": "ngram", "ngram": {"prompt_lookup_min": 1}}  # 1-grams: a random model repeats little
    speculating = dict(num_speculative_tokens=3, speculative_proposer=ngram)
    runs["torch"] = {"name": "torch", "torch": {"device": device, "dtype": "float32"}}
    for name, executor in runs.items():
        assert greedy_tokens(tiny_qwen3, executor, **speculating) == expected, f"{name}, speculating"
