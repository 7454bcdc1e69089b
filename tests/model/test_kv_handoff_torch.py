"""The torch executor's KV export/import: a prompt prefilled by one engine and decoded by another gives
the tokens one engine gives (greedy), in fp32 and bf16, with prefix caching and async scheduling on
the decode side; blocks of another dtype are refused before anything is written."""

from __future__ import annotations

import pytest

from hetero_core import SamplingParams
from hetero_core.builder import build_engine
from hetero_core.kv_transfer import KVHandoff
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings

PROMPTS = [[5 + (7 * i + j) % 200 for j in range(n)] for i, n in enumerate((1, 4, 6, 13, 22))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_model

    directory = tmp_path_factory.mktemp("handoff") / "llama"
    save_tiny_model("llama", directory)
    return directory


def make_engine(model_dir, **overrides):
    settings = load_settings(
        model=str(model_dir), executor="torch", tokenizer="byte", block_size=4, max_model_len=128, **overrides
    )
    return build_engine(settings, load_plugins(entry_points=[]))


def run_until(engine, request_id):
    while True:
        for out in engine.step():
            if out.request_id == request_id and out.finished:
                return out


def pair(prefill, decode, prompt, params):
    first = run_until(prefill, prefill.add_request(prompt, _one_token(params), export_kv=True))
    assert first.error is None, first.error
    handoff = KVHandoff(first.output_token_ids[0], first.kv_blocks)
    return run_until(decode, decode.add_request(prompt, params, kv_transfer=handoff))


def _one_token(params: SamplingParams) -> SamplingParams:
    from dataclasses import replace

    return replace(params, max_tokens=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "decode_settings",
    [{}, {"enable_prefix_caching": True, "async_scheduling": True}],
    ids=["plain", "prefix-cache+async"],
)
def test_prefill_here_decode_there_gives_one_engines_tokens(tiny_llama, dtype, decode_settings):
    opts = {"dtype": dtype}
    single = make_engine(tiny_llama, **opts)
    expected = [o.output_token_ids for o in single.generate(PROMPTS, GREEDY)]
    prefill, decode = make_engine(tiny_llama, **opts), make_engine(tiny_llama, **opts, **decode_settings)
    for _ in range(2):  # the second round hits the decode side's prefix cache when it has one
        got = [pair(prefill, decode, prompt, GREEDY) for prompt in PROMPTS]
        assert [o.error for o in got] == [None] * len(PROMPTS)
        assert [o.output_token_ids for o in got] == expected


def test_blocks_of_another_dtype_fail_the_request_by_name(tiny_llama):
    prefill, decode = make_engine(tiny_llama, dtype="float32"), make_engine(tiny_llama, dtype="bfloat16")
    out = pair(prefill, decode, PROMPTS[3], GREEDY)
    assert out.error is not None and "same model, dtype and block size" in out.error
    again = pair(make_engine(tiny_llama, dtype="bfloat16"), decode, PROMPTS[3], GREEDY)
    assert again.error is None  # the failed import left the decode engine working


@pytest.mark.parametrize("block_dim", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropping_leading_blocks_keeps_the_rest_byte_for_byte(block_dim, dtype):
    import torch

    from hetero_core.engine.kv.kv_transfer import without_first_blocks
    from hetero_core.kv_transfer import kv_tensor_from_torch, kv_tensor_to_torch

    shape = [3, 4, 5, 2]
    shape[block_dim] = 6  # six blocks along block_dim
    tensor = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
    kept = kv_tensor_to_torch(without_first_blocks(kv_tensor_from_torch(tensor), 2, block_dim))
    assert torch.equal(kept, tensor.narrow(block_dim, 2, 4))
