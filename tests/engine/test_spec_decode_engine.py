"""Speculative decoding in the engine, on the mock executor (whose token at a position depends only on
the request): with proposals the tokens, texts and finish reasons equal the run without them, under
continuous batching, chunked prefill, preemption (recompute and swap), prefix hits, stops inside a
kept run and max_tokens; rejected tokens leave no block behind. An oracle proposer (the reference
run's tokens, wrong at every third position) makes the mock keep most proposals."""

from __future__ import annotations

import logging

import pytest

import hetero_plugins_mock
from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import PluginError
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.plugin_system.hookspecs import hookimpl
from hetero_core.settings import load_settings

PROMPTS = [f"request number {i} " * (1 + i % 5) for i in range(10)]
TIGHT = dict(max_num_blocks=40, block_size=4, memory_threshold=1.0)


def greedy(max_tokens=24, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


class OracleProposer:
    """Proposes what the reference run generated next (found by the prompt), wrong at every third
    output position; records what it was asked and released."""

    def __init__(self, reference: dict[tuple[int, ...], list[int]]) -> None:
        self.reference, self.asked, self.released, self.live = reference, [], [], set()

    def propose(self, inputs):
        out = []
        for given in inputs:
            self.asked.append(given)
            self.live.add(given.seq_id)
            tokens = list(given.token_ids)
            prompt = next((p for p in self.reference if tuple(tokens[: len(p)]) == p), None)
            continuation = [] if prompt is None else self.reference[prompt]
            done = 0 if prompt is None else len(tokens) - len(prompt)
            guess = continuation[done : done + given.num_tokens]
            out.append([t if (done + j) % 3 != 2 else (t + 1) % 100 for j, t in enumerate(guess)])
        return out

    def release(self, seq_id):
        self.released.append(seq_id)
        self.live.discard(seq_id)

    def shutdown(self):
        pass


class OraclePlugin:
    def __init__(self, reference):
        self.reference, self.proposers = reference, []

    @hookimpl
    def register_speculative_proposers(self, register):
        register("oracle", self.create)

    def create(self, ctx):
        self.proposers.append(OracleProposer(self.reference))
        return self.proposers[-1]


def mock_engine(plugin=None, k=0, mock_options=None, **overrides):
    extra = [("mock", hetero_plugins_mock)] + ([("oracle", plugin)] if plugin is not None else [])
    overrides.setdefault("speculative_proposer", "oracle" if plugin is not None else "ngram")
    settings = load_settings(
        executor={"name": "mock", "mock": mock_options or {}}, num_speculative_tokens=k, **overrides
    )
    return build_engine(settings, load_plugins(entry_points=[], extra_plugins=extra))


def reference_run(prompts=PROMPTS, params=None, mock_options=None):
    outputs = mock_engine(mock_options=mock_options).generate(prompts, params or greedy())
    return outputs, {tuple(o.prompt_token_ids): list(o.output_token_ids) for o in outputs}


def same(outputs, reference):
    return [(o.output_token_ids, o.text, o.finish_reason) for o in outputs] == [
        (o.output_token_ids, o.text, o.finish_reason) for o in reference
    ]


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize(
    "setting",
    [
        {},
        {"max_prefill_chunk": 5},  # chunked prefill
        {**TIGHT, "preemption_mode": "recompute"},
        {**TIGHT, "preemption_mode": "swap"},
        {**TIGHT, "preemption_mode": "recompute", "enable_prefix_caching": False},
        {"max_total_tokens": 7},  # a token budget smaller than the proposals: fewer are verified
    ],
    ids=["plain", "chunked", "recompute", "swap", "recompute-no-cache", "tight-budget"],
)
def test_greedy_tokens_equal_the_run_without_speculation(k, setting):
    reference, continuations = reference_run()
    plugin = OraclePlugin(continuations)
    engine = mock_engine(plugin, k, **setting)
    outputs = engine.generate(PROMPTS, greedy())
    assert same(outputs, reference)
    stats = engine.stats()
    assert stats.spec_num_accepted_tokens > 0 and stats.spec_num_draft_tokens > stats.spec_num_accepted_tokens
    assert 1 < stats.spec_mean_accepted_length <= k + 1
    if "preemption_mode" in setting:
        assert stats.num_preemptions > 0
    assert stats.num_free_blocks == stats.num_blocks  # nothing left behind, rejected slots included
    proposer = plugin.proposers[0]
    assert not proposer.live and all(1 <= p.num_tokens <= k for p in proposer.asked)


def test_continuous_batching_with_requests_arriving_mid_run():
    reference, continuations = reference_run()
    engine = mock_engine(OraclePlugin(continuations), 3, **TIGHT)
    ids, finals, step = [], {}, 0
    while len(finals) < len(PROMPTS):
        if step % 3 == 0 and len(ids) < len(PROMPTS):  # a new request every third step
            ids.append(engine.add_request(PROMPTS[len(ids)], greedy()))
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        step += 1
    assert same([finals[i] for i in ids], reference)
    assert engine.stats().spec_num_accepted_tokens > 0


def test_prefix_hits_with_speculation():
    shared = "a shared system prompt that fills several blocks. "
    prompts = [shared + p for p in PROMPTS[:6]]
    reference, continuations = reference_run(prompts)
    engine = mock_engine(OraclePlugin(continuations), 4, block_size=4)
    first = engine.generate(prompts[:3], greedy())
    second = engine.generate(prompts[3:], greedy())
    assert same(first + second, reference)
    assert engine.stats().prefix_cache_hit_tokens > 0


def test_stop_strings_and_eos_inside_a_kept_run_end_the_request_there():
    _, continuations = reference_run()  # the oracle proposes past every stop
    stop_params = []
    for tokens in continuations.values():
        text = bytes(tokens).decode("latin-1")
        stop_params.append(greedy(stop=[text[5:7]]))  # a stop string a few tokens in
    reference = mock_engine().generate(PROMPTS, stop_params)
    outputs = mock_engine(OraclePlugin(continuations), 4).generate(PROMPTS, stop_params)
    assert same(outputs, reference) and any(o.finish_reason == "stop" for o in outputs)

    eos_params = SamplingParams(temperature=0, max_tokens=24)
    eos_reference = mock_engine(mock_options={"eos_after": 6}).generate(PROMPTS, eos_params)
    _, past_eos = reference_run(params=greedy(), mock_options={"eos_after": 6})
    engine = mock_engine(OraclePlugin(past_eos), 4, mock_options={"eos_after": 6})
    outputs = engine.generate(PROMPTS, eos_params)
    assert same(outputs, eos_reference) and all(o.finish_reason == "eos" for o in outputs)


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7])
def test_max_tokens_cuts_inside_what_would_be_kept(max_tokens):
    reference = mock_engine().generate(PROMPTS, greedy(max_tokens))
    _, continuations = reference_run()
    plugin = OraclePlugin(continuations)
    outputs = mock_engine(plugin, 4).generate(PROMPTS, greedy(max_tokens))
    assert same(outputs, reference) and all(len(o.output_token_ids) == max_tokens for o in outputs)
    # never asked for more than max_tokens allows: the token it runs + proposals + the target's own
    assert all(p.num_tokens <= max_tokens - 2 for p in plugin.proposers[0].asked)


def test_requests_whose_features_do_not_compose_run_unspeculated_in_the_same_batches():
    _, continuations = reference_run()
    plugin = OraclePlugin(continuations)
    engine = mock_engine(plugin, 3)
    params = [greedy(presence_penalty=0.5) if i % 2 else greedy() for i in range(len(PROMPTS))]
    reference = mock_engine().generate(PROMPTS, params)
    outputs = engine.generate(PROMPTS, params)
    assert same(outputs, reference)
    asked_prompts = {
        tuple(p.token_ids[: len(o.prompt_token_ids)])
        for p in plugin.proposers[0].asked
        for o in outputs
        if tuple(p.token_ids[: len(o.prompt_token_ids)]) == tuple(o.prompt_token_ids)
    }
    assert asked_prompts == {tuple(o.prompt_token_ids) for i, o in enumerate(outputs) if i % 2 == 0}


class BrokenProposer:
    def __init__(self, mode):
        self.mode = mode

    def propose(self, inputs):
        if self.mode == "raise":
            raise RuntimeError("boom")
        return [[10**9] for _ in inputs]  # outside the vocabulary

    def release(self, seq_id):
        pass

    def shutdown(self):
        pass


@pytest.mark.parametrize("mode", ["raise", "out-of-vocabulary"])
def test_a_broken_proposer_costs_its_proposals_not_the_requests(mode, caplog):
    class Plugin:
        @hookimpl
        def register_speculative_proposers(self, register):
            register("broken", lambda ctx: BrokenProposer(mode))

    settings = load_settings(executor="mock", num_speculative_tokens=2, speculative_proposer="broken")
    engine = build_engine(
        settings,
        load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock), ("broken", Plugin())]),
    )
    with caplog.at_level(logging.WARNING, logger="hetero"):
        outputs = engine.generate(PROMPTS[:3], greedy(8))
    assert same(outputs, mock_engine().generate(PROMPTS[:3], greedy(8)))
    assert engine.stats().spec_num_draft_tokens == 0
    assert sum("speculation.proposals_dropped" in r.getMessage() for r in caplog.records) == 1


def test_an_executor_that_cannot_verify_is_refused_by_name():
    settings = load_settings(executor="null", num_speculative_tokens=2)
    refusal = "executor 'null' cannot verify speculative tokens.*num_speculative_tokens = 0"
    with pytest.raises(PluginError, match=refusal):
        build_engine(settings, load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)]))


def test_speculation_turns_async_scheduling_off():
    assert mock_engine(k=2, async_scheduling=True).async_scheduling is False
    assert mock_engine(k=0, async_scheduling=True).async_scheduling is True


def test_ngram_options_reach_the_proposer():
    engine = mock_engine(
        k=2, speculative_proposer={"name": "ngram", "ngram": {"prompt_lookup_max": 3, "prompt_lookup_min": 2}}
    )
    proposer = engine.speculation.proposer
    assert (proposer.min_n, proposer.max_n) == (2, 3)


def test_the_executor_kit_checks_the_rows_of_speculating_sequences():
    import dataclasses

    from hetero_core.testing import ContractFailure, ExecutorContract
    from hetero_plugins_mock.executor import MockExecutor

    class OneRowOnly(MockExecutor):  # declares verification but ignores num_spec_tokens
        def execute(self, batch):
            return super().execute(dataclasses.replace(batch, num_spec_tokens=None))

    class Shifted(MockExecutor):  # the rows of the wrong positions (one too early)
        def _next_token(self, batch, i, position=None):
            shift = 0 if position is None or batch.num_spec_tokens is None else 1
            return super()._next_token(batch, i, None if position is None else position - shift)

    for executor, message in ((OneRowOnly, "3 token ids for 6"), (Shifted, "1 \\+ n rows per sequence")):

        class Kit(ExecutorContract):
            vocab_size = 258

            def make_executor(self, ctx, executor=executor):
                return executor(ctx)

        kit = Kit()
        with pytest.raises(ContractFailure, match=message):
            kit.test_speculative_rows_match_one_token_steps()
        kit.teardown_method(None)
