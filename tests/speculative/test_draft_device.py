"""The ``draft`` proposer on the target's device: CUDA on a GPU machine (scripts/gpu_check.sh runs this
file), the CPU elsewhere, so the wiring is checked everywhere. A tiny random Llama is the target and
its own draft (the same vocabulary): greedy output equal to the output without speculation, the draft
model's cache on the target's device, proposals kept."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402
from tests.model.tiny_models import save_tiny_model  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = [list(range(3, 30)), [5, 9, 2, 77, 41] * 5, [44, 45], list(range(60, 20, -1))]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("draft_device") / "llama"
    save_tiny_model("llama", directory)
    return directory


def generate(model_dir, **settings):
    executor = {"name": "torch", "torch": {"device": DEVICE, "dtype": "float32"}}
    settings = load_settings(
        model=str(model_dir),
        tokenizer="byte",
        executor=executor,
        block_size=16,
        max_model_len=128,
        max_num_blocks=48,
        max_batch_size=4,
        **settings,
    )
    engine = build_engine(settings, load_plugins(entry_points=[]))
    try:
        outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
        proposer = engine.speculation.proposer if engine.speculation is not None else None
        return [o.output_token_ids for o in outputs], engine.stats(), proposer
    finally:
        engine.shutdown()


def test_the_draft_runs_on_the_targets_device_and_keeps_the_output(tiny_llama):
    expected, _, _ = generate(tiny_llama)
    draft = {"name": "draft", "draft": {"model": str(tiny_llama), "dtype": "float32"}}
    tokens, stats, proposer = generate(tiny_llama, speculative_proposer=draft, num_speculative_tokens=3)
    assert proposer.executor.device.type == DEVICE
    assert tokens == expected
    assert stats.spec_num_draft_tokens > 0 and stats.spec_num_accepted_tokens > 0
