"""The ``draft`` proposer: its proposals are the draft model's own greedy continuation, whatever was
accepted before; its KV pool frees and runs out cleanly; a model of another tokenizer is refused."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from hetero_core.errors import ConfigError  # noqa: E402
from hetero_core.testing import ProposerContract  # noqa: E402
from tests.speculative.draft_helpers import Item, make_draft_proposer  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
K = 4


@pytest.fixture(scope="module")
def greedy_continuations(smollm2_dir):
    """The embedded model's own greedy continuations (12 tokens) through ``LLM``, with the prompt ids."""
    from hetero_core import LLM, SamplingParams

    llm = LLM(str(smollm2_dir), "torch", dtype="float32")
    outputs = llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    llm.engine.shutdown()
    return [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outputs]


@pytest.fixture(scope="module")
def proposer(smollm2_dir):
    proposer = make_draft_proposer(smollm2_dir, max_num_blocks=64)
    yield proposer
    proposer.shutdown()


def test_proposals_are_the_draft_models_greedy_continuation(proposer, greedy_continuations):
    items = [Item(i, tuple(prompt), K) for i, (prompt, _) in enumerate(greedy_continuations)]
    proposals = proposer.propose(items)
    assert proposals == [out[:K] for _, out in greedy_continuations]
    # all accepted plus the target's token: the next proposals continue the same greedy run
    items = [Item(i, tuple(prompt + out[: K + 1]), K) for i, (prompt, out) in enumerate(greedy_continuations)]
    assert proposer.propose(items) == [out[K + 1 : 2 * K + 1] for _, out in greedy_continuations]
    for i in range(len(PROMPTS)):
        proposer.release(i)


def test_rollback_after_a_partial_acceptance_equals_a_fresh_proposer(
    proposer, smollm2_dir, greedy_continuations
):
    prompt, out = greedy_continuations[0]
    first = proposer.propose([Item(7, tuple(prompt), K)])[0]
    corrected = prompt + first[:1] + [first[1] + 1]  # the target took one and replaced the second
    rolled_back = proposer.propose([Item(7, tuple(corrected), K)])
    fresh = make_draft_proposer(smollm2_dir, max_num_blocks=8)
    try:
        assert rolled_back == fresh.propose([Item(0, tuple(corrected), K)])
    finally:
        fresh.shutdown()
    proposer.release(7)


def test_sequences_ask_for_different_numbers_of_tokens(proposer, greedy_continuations):
    items = [
        Item(i, tuple(prompt), n) for i, ((prompt, _), n) in enumerate(zip(greedy_continuations, (1, 0, 3)))
    ]
    assert proposer.propose(items) == [greedy_continuations[0][1][:1], [], greedy_continuations[2][1][:3]]
    for i in range(len(PROMPTS)):
        proposer.release(i)


def test_release_frees_the_blocks_and_a_full_pool_proposes_nothing(smollm2_dir, greedy_continuations):
    prompt, out = greedy_continuations[0]
    needed = -(-(len(prompt) + K - 1) // 4)  # blocks of 4 for the prompt and K - 1 proposed tokens
    proposer = make_draft_proposer(smollm2_dir, max_num_blocks=needed + 1, block_size=4)
    try:
        both = [Item(0, tuple(prompt), K), Item(1, tuple(prompt), K)]
        assert proposer.propose(both) == [out[:K], []]  # the second finds one block: no proposal, no error
        assert proposer.num_free_blocks == 1
        proposer.release(0)
        assert proposer.num_free_blocks == needed + 1
        assert proposer.propose([Item(1, tuple(prompt), K)]) == [out[:K]]
        proposer.release(1)
        proposer.release(1)  # twice, or an id it never saw: nothing to do
        assert proposer.num_free_blocks == needed + 1
    finally:
        proposer.shutdown()


def test_a_draft_model_of_another_tokenizer_is_refused_at_startup(smollm2_dir, tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"vocab_size": 49152, "architectures": ["LlamaForCausalLM"]})
    )
    vocab = {f"t{i}": i for i in range(49152)}
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []})
    )
    from hetero_core.default_plugins.draft_options import DraftProposerOptions

    with pytest.raises(ConfigError, match="another tokenizer than the target"):
        make_draft_proposer(smollm2_dir, options=DraftProposerOptions(model=str(tmp_path)))


class TestDraftProposerContract(ProposerContract):
    vocab_size = 49152
    executor = "torch"
    seeds = (0, 1)

    @pytest.fixture(autouse=True)
    def _embedded_target(self, smollm2_dir):
        self.model_dir = smollm2_dir  # the target's tokenizer: the draft's own

    def make_proposer(self, ctx):
        from hetero_core.default_plugins.draft import DraftProposer
        from hetero_core.default_plugins.draft_options import DraftProposerOptions

        return DraftProposer(ctx, DraftProposerOptions(dtype="float32", num_blocks=256))


def test_the_draft_runs_on_the_targets_device_unless_told():
    from hetero_core.default_plugins.draft import draft_device
    from hetero_core.default_plugins.draft_options import DraftProposerOptions

    default = DraftProposerOptions()
    assert draft_device("torch", default, {}) == "cpu"
    assert draft_device("torch", default, {"device": "cuda:1"}) == "cuda:1"
    assert draft_device("cuda", default, {}) == "cuda" and draft_device("triton", default, {}) == "cuda"
    assert draft_device("cuda", DraftProposerOptions(device="cpu"), {}) == "cpu"


def test_a_draft_model_without_a_tokenizer_must_match_the_targets_vocab_size(smollm2_dir, tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"vocab_size": 32000, "architectures": ["LlamaForCausalLM"]})
    )
    from hetero_core.default_plugins.draft_options import DraftProposerOptions

    with pytest.raises(ConfigError, match="has vocab_size 32000, the target 49152"):
        make_draft_proposer(smollm2_dir, options=DraftProposerOptions(model=str(tmp_path)))
