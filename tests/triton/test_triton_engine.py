"""The whole engine on the triton executor gives the torch executor's greedy tokens: on a tiny random
Llama (mixed, chunked and preempting steps) and, through the CLI, on the embedded SmolLM2.

On a CPU machine the kernels run through Triton's interpreter (``executor.triton.interpreter``); on a
GPU they run compiled, and the comparison is made in float32 there too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hetero_plugins_triton
from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from tests.model.tiny_models import save_tiny_model

PROMPTS = [list(range(3, 40)), list(range(10, 17)), [5, 9, 2, 77, 41] * 14, [44], list(range(60, 3, -1))]
MAX_TOKENS = (6, 10, 5, 8, 7)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("triton_engine") / "llama"
    save_tiny_model("llama", directory)
    return directory


def greedy_tokens(model_dir, executor: dict, **limits) -> list[list[int]]:
    settings = load_settings(
        model=str(model_dir), tokenizer="byte", executor=executor, block_size=16, max_model_len=160, **limits
    )
    plugins = load_plugins(entry_points=[], extra_plugins=[("triton", hetero_plugins_triton)])
    engine = build_engine(settings, plugins)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    try:
        return [o.output_token_ids for o in engine.generate(PROMPTS, params)]
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "limits",
    [
        dict(max_num_blocks=40, max_batch_size=4, max_total_tokens=40),  # chunked prefills mixed with decodes
        dict(max_num_blocks=8, max_batch_size=5, max_total_tokens=256),  # a tiny pool: preemption
    ],
)
def test_engine_greedy_tokens_equal_the_torch_executors(tiny_llama, mode, limits):
    # float32 on both sides: the torch executor's dtype "auto" is bf16 on a GPU (and on some CPUs)
    torch_fp32 = {"name": "torch", "torch": {"device": str(mode.device), "dtype": "float32"}}
    expected = greedy_tokens(tiny_llama, torch_fp32, **limits)
    triton = {
        "name": "triton",
        "triton": {
            "interpreter": mode.interpret,
            "dtype": "float32",
            "device": str(mode.device),
            "num_splits": 2,
        },
    }
    got = greedy_tokens(tiny_llama, triton, **limits)
    assert [len(t) for t in got] == list(MAX_TOKENS)
    assert got == expected


def test_speculative_decoding_keeps_the_torch_executors_greedy_tokens(tiny_llama, mode):
    """Verification rows (1 + n per speculating sequence, through the prefill kernel) on triton."""
    torch_fp32 = {"name": "torch", "torch": {"device": str(mode.device), "dtype": "float32"}}
    limits = dict(max_num_blocks=40, max_batch_size=4, max_total_tokens=40)
    expected = greedy_tokens(tiny_llama, torch_fp32, **limits)
    triton = {
        "name": "triton",
        "triton": {
            "interpreter": mode.interpret,
            "dtype": "float32",
            "device": str(mode.device),
            "num_splits": 2,
        },
    }
    ngram = {"name": "ngram", "ngram": {"prompt_lookup_min": 1}}  # a random model repeats little
    assert (
        greedy_tokens(tiny_llama, triton, num_speculative_tokens=3, speculative_proposer=ngram, **limits)
        == expected
    )


@pytest.mark.slow
def test_cli_on_the_embedded_model_matches_the_torch_executor(smollm2_dir, mode):
    """`hetero run --executor triton` in interpreter mode answers like the torch executor (greedy)."""
    if not mode.interpret:
        pytest.skip("interpreter-mode check; on a GPU the kernel and engine tests above cover the real path")
    common = ["run", "--temperature", "0", "--max-tokens", "6", "--ignore-eos", "The capital of France is"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_") or k == "HETERO_CACHE_DIR"}

    def answer(*flags: str, extra_env: dict | None = None) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "hetero_core", *common, *flags],
            capture_output=True,
            text=True,
            env={**env, **(extra_env or {})},
            timeout=600,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    expected = answer("--executor", "torch")
    got = answer("--executor", "triton", extra_env={"TRITON_INTERPRET": "1"})
    assert got.strip() and got == expected
