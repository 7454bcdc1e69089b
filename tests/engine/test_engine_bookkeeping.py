"""Engine bookkeeping: every request ends exactly once, bad input fails alone, nothing leaks."""

from __future__ import annotations

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.scheduling.batch import ExecutorOutput
from hetero_core.errors import InvalidRequestError
from hetero_core.executor import ExecutorCapabilities


def greedy(max_tokens=8, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def run_all(engine):
    """Step until idle; request id -> list of final outputs (to check each ends exactly once)."""
    finals: dict[str, list] = {}
    for _ in range(1000):
        for out in engine.step():
            if out.finished:
                finals.setdefault(out.request_id, []).append(out)
        if (
            not engine.has_unfinished_requests()
            and not engine.state.finished_outputs
            and not engine.state.held_outputs
        ):
            return finals
    raise AssertionError("engine did not become idle")


def assert_empty(engine):
    allocator = engine.scheduler.allocator
    assert engine.state.seqs == {} and engine.state.detokenizers == {} and engine.state.held_outputs == {}
    assert engine.state.finished_outputs == []
    assert not engine.scheduler.waiting and not engine.scheduler.running
    assert allocator.num_free_blocks == allocator.num_blocks


class ScriptedExecutor:
    """Returns logits chosen per call: ``script(batch, rows)`` gives one row of logits per sampled seq."""

    def __init__(self, script, vocab_size=258):
        self.script, self.vocab_size, self.calls = script, vocab_size, 0
        self.capabilities = ExecutorCapabilities(vocab_size=vocab_size)

    def execute(self, batch):
        import torch

        self.calls += 1
        rows = torch.full((len(batch.sample_indices), self.vocab_size), -10.0)
        for row, i in enumerate(batch.sample_indices):
            rows[row, ord("a")] = 10.0
            self.script(rows[row], batch, i, self.calls)
        return ExecutorOutput(logits=rows)

    def shutdown(self):
        pass


# -- prompts ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompt, message",
    [
        (None, "a prompt is a string, a list of token ids or a list of chat messages"),
        (42, "got int"),
        (b"bytes", "got bytes"),
        ({"role": "user", "content": "hi"}, "got dict"),
        ("caf\ud800", "lone surrogate '\\ud800' at index 3"),
        ([], "the prompt is empty"),
        ("", "the prompt is empty"),
        ([1, "2"], "this list holds str items"),
        ([True, False], "this list holds bool items"),
        ([1, 2, 10**9], "prompt token ids out of range [0, 258)"),
        ([{"role": "user"}], "message 0: missing 'content'"),
        ([{"role": "user", "content": "hi", "extra": 1}], "message 0: unknown key 'extra'"),
        ([{"role": "user", "content": 5}], "message 0: 'content' must be a string, got int"),
        ([{"role": "user", "content": "\udc80"}], "lone surrogate"),
        ([{"role": "", "content": "x"}], "'role' is empty"),
        ([{"role": "user", "content": "x"}, 3], "this list holds"),
    ],
)
def test_bad_prompts_are_a_clear_error_and_keep_nothing(make_mock_engine, prompt, message):
    engine = make_mock_engine()
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(prompt, greedy())
    assert message in str(err.value)
    assert_empty(engine)


def test_prompts_as_text_token_ids_and_messages_run(make_mock_engine):
    engine = make_mock_engine()
    outputs = engine.generate(["hi", [104, 105], (104, 105), [{"role": "user", "content": "hi"}]], greedy(3))
    assert [o.error for o in outputs] == [None] * 4 and all(len(o.output_token_ids) == 3 for o in outputs)


def test_generate_reports_bad_prompts_in_order_and_accepts_a_single_string(make_mock_engine):
    engine = make_mock_engine()
    outputs = engine.generate([None, "ok", 42, "caf\ud800"], greedy(2))
    assert [o.failed for o in outputs] == [True, False, True, True]
    assert outputs[3].prompt == "caf?" and "lone surrogate" in outputs[3].error
    assert len(engine.generate("one prompt", greedy(2))) == 1
    assert_empty(engine)


# -- parameters ---------------------------------------------------------------------------------
def test_a_dict_of_params_overrides_the_defaults(make_mock_engine):
    engine = make_mock_engine(max_tokens=5)
    default_length = engine.add_request("hello", {"temperature": 0, "stop": None})
    short = engine.add_request("hello", {"temperature": 0, "max_tokens": 2})
    finals = run_all(engine)
    assert len(finals[default_length][0].output_token_ids) == 5  # the engine's default max_tokens
    assert len(finals[short][0].output_token_ids) == 2


@pytest.mark.parametrize(
    "params, message",
    [
        ({"temprature": 0.5}, "did you mean 'temperature'"),
        ({"logprobs": 1.5}, "logprobs must be an integer or None"),
        ([("temperature", 0)], "must be a SamplingParams or a dict, got list"),
        ("greedy", "got str"),
    ],
)
def test_bad_params_are_rejected_at_once(make_mock_engine, params, message):
    engine = make_mock_engine()
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request("hello", params)
    assert_empty(engine)


def test_a_seed_beyond_64_bits_runs_on_the_mock(make_mock_engine):
    outputs = make_mock_engine().generate(["a", "b"], [greedy(4, seed=2**64), greedy(4, seed=-(2**70))])
    assert [o.error for o in outputs] == [None, None]


def test_request_ids_must_be_strings(make_mock_engine):
    with pytest.raises(InvalidRequestError, match="request_id must be a string, got int"):
        make_mock_engine().add_request("x", greedy(), request_id=5)


# -- what can never run -------------------------------------------------------------------------
def test_add_request_rejects_what_can_never_run(make_mock_engine):
    engine = make_mock_engine(max_model_len=64, max_num_blocks=64)
    with pytest.raises(InvalidRequestError, match="exceeds max_model_len \\(64\\)"):
        engine.add_request("x" * 60, greedy(8))
    engine = make_mock_engine(max_num_blocks=4, block_size=4, max_model_len=2048)
    with pytest.raises(InvalidRequestError, match="whole pool has 4"):
        engine.add_request("y" * 40, greedy(4))
    assert_empty(engine)


def test_a_request_that_can_never_be_admitted_while_nothing_runs_fails_with_a_reason(make_mock_engine):
    engine = make_mock_engine(max_num_blocks=8, block_size=4)
    allocator = engine.scheduler.allocator
    held_elsewhere: list[int] = []
    allocator.allocate_slots(held_elsewhere, 0, 6 * 4)  # 6 of 8 blocks taken outside the scheduler
    rid = engine.add_request("x" * 20, greedy(4))  # needs 6 blocks: fits the pool, not what is free
    finals = run_all(engine)
    assert len(finals[rid]) == 1 and "can never be scheduled" in finals[rid][0].error
    assert "2 of 8 are free" in finals[rid][0].error
    allocator.free(held_elsewhere)
    assert_empty(engine)


# -- every request ends once, generate() swallows nothing ---------------------------------------
def test_generate_keeps_outputs_of_requests_added_another_way(make_mock_engine):
    engine = make_mock_engine()
    other = engine.add_request("added by a streaming caller", greedy(3))
    long_other = engine.add_request("a long one", greedy(40))
    mine = engine.generate(["mine"], greedy(2))
    assert [o.finished for o in mine] == [True]
    finals = run_all(engine)
    assert len(finals[other]) == 1 and finals[other][0].finish_reason == "length"
    assert len(finals[long_other]) == 1 and len(finals[long_other][0].output_token_ids) == 40
    assert_empty(engine)


def test_abort_of_a_finished_request_reports_nothing_more(make_mock_engine):
    engine = make_mock_engine()
    rid = engine.add_request("x", greedy(1))
    engine.step()
    assert not engine.abort(rid) and not engine.abort("nope") and not engine.abort(None)
    assert run_all(engine) == {}
    assert_empty(engine)


# -- failures stay with their request -----------------------------------------------------------
def test_non_finite_logits_fail_that_request_alone_and_the_next_step_runs(make_mock_engine):
    engine = make_mock_engine()

    def poison(row, batch, i, call):
        if batch.num_prompt_tokens[i] == 3 and call == 2:
            row[5] = float("nan")

    engine.executor = ScriptedExecutor(poison)
    bad = engine.add_request("bad", greedy(4))
    good = engine.add_request("good one", SamplingParams(max_tokens=4, seed=1, top_p=0.9))
    finals = run_all(engine)
    assert "not finite" in finals[bad][0].error and finals[bad][0].output_token_ids == [ord("a")]
    assert finals[good][0].error is None and finals[good][0].text == "aaaa"
    assert len(finals[bad]) == len(finals[good]) == 1
    assert_empty(engine)


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_all_minus_inf_or_plus_inf_rows_fail_too(make_mock_engine, value):
    engine = make_mock_engine()

    def poison(row, batch, i, call):
        row[:] = value

    engine.executor = ScriptedExecutor(poison)
    out = engine.generate(["x"], greedy(2))[0]
    assert out.failed and "not finite" in out.error
    assert_empty(engine)


def test_an_executor_that_raises_fails_its_batch_and_the_engine_goes_on(make_mock_engine):
    engine = make_mock_engine()
    inner = engine.executor

    class Flaky:
        calls = 0
        capabilities = inner.capabilities

        def execute(self, batch):
            Flaky.calls += 1
            if Flaky.calls == 2:
                raise RuntimeError("device lost")
            return inner.execute(batch)

        def shutdown(self):
            pass

    engine.executor = Flaky()
    first = engine.generate(["a", "b"], greedy(4))
    assert all(
        "the executor failed on this request's batch: RuntimeError: device lost" in o.error for o in first
    )
    assert [o.error for o in engine.generate(["c"], greedy(4))] == [None]
    assert_empty(engine)


def test_token_ids_outside_the_vocabulary_fail_that_request(make_mock_engine):
    engine = make_mock_engine()
    inner = engine.executor

    class OutOfVocab:
        capabilities = inner.capabilities

        def execute(self, batch):
            out = inner.execute(batch)
            return ExecutorOutput(
                token_ids=[
                    10**6 if batch.num_prompt_tokens[i] == 1 else t
                    for i, t in zip(batch.sample_indices, out.token_ids)
                ]
            )

        def shutdown(self):
            pass

    engine.executor = OutOfVocab()
    bad, good = engine.generate(["x", "yy"], greedy(3))
    assert "outside the vocabulary [0, 258)" in bad.error and good.error is None
    assert_empty(engine)


# -- nothing leaks --------------------------------------------------------------------------------
def test_a_stop_string_finish_leaks_no_detokenizer(make_mock_engine):
    engine = make_mock_engine()
    text = engine.generate(["hello"], greedy(40, ignore_eos=True))[0].text
    out = engine.generate(["hello"], greedy(40, ignore_eos=True, stop=[text[5:7]]))[0]
    assert out.finish_reason == "stop" and out.text == text[:5]
    assert_empty(engine)


def test_text_never_ends_in_a_cut_character(make_mock_engine):
    engine = make_mock_engine()
    first_byte_of = "你".encode()

    def chinese(row, batch, i, call):
        output_index = batch.context_lens[i] - batch.num_prompt_tokens[i]
        row[ord("a")] = -10.0
        row[first_byte_of[output_index % 3]] = 10.0

    engine.executor = ScriptedExecutor(chinese)
    cut = engine.generate(["x"], greedy(5))[0]  # 你 + two bytes of the next 你
    assert cut.text == "你" and len(cut.output_token_ids) == 5
    assert_empty(engine)
