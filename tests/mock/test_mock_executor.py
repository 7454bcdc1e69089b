"""The mock executor: deterministic, stop paths, latency, and it catches inconsistent batches."""

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.scheduling.batch import Batch
from hetero_core.errors import ConfigError
from hetero_core.executor import ExecutorContext
from hetero_plugins_mock.executor import BatchInconsistency, MockExecutor
from hetero_plugins_mock.options import MockExecutorOptions


def greedy(max_tokens=8, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def test_tokens_are_a_function_of_seed_prompt_and_position_only(make_mock_engine):
    prompts = ["hello world", "你好，世界！", "the quick brown fox"]
    a = make_mock_engine(block_size=16).generate(prompts, greedy(16, ignore_eos=True))
    b = make_mock_engine(block_size=2, max_batch_size=1).generate(prompts, greedy(16, ignore_eos=True))
    assert [o.output_token_ids for o in a] == [o.output_token_ids for o in b]
    assert len({tuple(o.output_token_ids) for o in a}) == 3  # different prompts, different tokens
    other_seed = make_mock_engine(mock_options={"seed": 7}).generate(prompts, greedy(16, ignore_eos=True))
    assert [o.output_token_ids for o in other_seed] != [o.output_token_ids for o in a]
    per_request = make_mock_engine().generate(prompts, greedy(16, ignore_eos=True, seed=3))
    assert [o.output_token_ids for o in per_request] != [o.output_token_ids for o in a]


def test_default_tokens_are_printable_ascii(make_mock_engine):
    out = make_mock_engine().generate(["hi"], greedy(64, ignore_eos=True))[0]
    assert all(32 <= t < 127 for t in out.output_token_ids)
    assert out.text.isprintable() and len(out.text) == 64


def test_vocab_options_bound_the_tokens(make_mock_engine):
    out = make_mock_engine(mock_options={"first_token_id": 65, "vocab_size": 70}).generate(
        ["hi"], greedy(50, ignore_eos=True)
    )[0]
    assert set(out.text) <= set("ABCDE")


def test_eos_after_n_tokens(make_mock_engine):
    out = make_mock_engine(mock_options={"eos_after": 5}).generate(["stop soon"], greedy(50))[0]
    assert out.finish_reason == "eos"
    assert len(out.output_token_ids) == 5 and out.output_token_ids[-1] == 257
    assert len(out.text) == 4  # EOS adds no text
    ignored = make_mock_engine(mock_options={"eos_after": 5}).generate(
        ["stop soon"], greedy(12, ignore_eos=True)
    )[0]
    assert ignored.finish_reason == "length" and len(ignored.output_token_ids) == 12


def test_eos_probability_ends_some_requests_early(make_mock_engine):
    outs = make_mock_engine(mock_options={"eos_probability": 0.2}).generate(
        [f"prompt {i}" for i in range(20)], greedy(5)
    )
    reasons = {o.finish_reason for o in outs}
    assert reasons == {"eos", "length"}
    assert all(o.output_token_ids[-1] == 257 for o in outs if o.finish_reason == "eos")


def test_stop_string_truncates_the_text(make_mock_engine):
    full = make_mock_engine().generate(["stop strings"], greedy(40, ignore_eos=True))[0].text
    stop = full[10:12]
    out = make_mock_engine().generate(["stop strings"], greedy(40, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == full[: full.index(stop)]
    kept = make_mock_engine().generate(
        ["stop strings"], greedy(40, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    )[0]
    assert kept.text == full[: full.index(stop) + 2]


def test_stop_token_ids(make_mock_engine):
    full = make_mock_engine().generate(["ids"], greedy(30, ignore_eos=True))[0]
    target = full.output_token_ids[6]
    out = make_mock_engine().generate(["ids"], greedy(30, ignore_eos=True, stop_token_ids=[target]))[0]
    first = full.output_token_ids.index(target)
    assert out.finish_reason == "stop" and out.output_token_ids == full.output_token_ids[: first + 1]


def test_simulated_latency_sleeps_per_prefill_token_and_decode_step(make_mock_engine, monkeypatch):
    slept = []
    monkeypatch.setattr("hetero_plugins_mock.executor.time.sleep", slept.append)
    options = {"prefill_latency_per_token": 0.001, "decode_latency_per_step": 0.01}
    make_mock_engine(mock_options=options).generate(["abcd"], greedy(3, ignore_eos=True))
    assert slept == pytest.approx([0.004, 0.01, 0.01])


def _context(**options):
    return ExecutorContext(
        settings=None,
        options=MockExecutorOptions(**options),
        model_dir=None,
        num_blocks=4,
        block_size=4,
        max_model_len=64,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        eos_token_id=257,
        vocab_size=258,
    )


def _batch(**changes):
    values = dict(
        seq_ids=[0],
        token_ids=[1, 2, 3],
        positions=[0, 1, 2],
        slot_mapping=[8, 9, 10],
        query_start_loc=[0, 3],
        context_lens=[3],
        block_tables=[[2]],
        is_prefill=[True],
        sample=[True],
        num_prompt_tokens=[3],
        seeds=[None],
        block_size=4,
    )
    values.update(changes)
    return Batch(**values)


def test_a_consistent_batch_runs():
    assert MockExecutor(_context()).execute(_batch()).token_ids[0] >= 32


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"slot_mapping": [8, 8, 10]}, "same slot"),
        ({"slot_mapping": [4, 5, 6]}, "outside its blocks"),
        ({"positions": [0, 2, 3]}, "not contiguous"),
        ({"block_tables": [[]]}, "too short"),
    ],
)
def test_inconsistent_batches_are_caught(changes, message):
    with pytest.raises(BatchInconsistency, match=message):
        MockExecutor(_context()).execute(_batch(**changes))


def test_reading_a_prompt_through_a_wrong_block_table_is_caught():
    executor = MockExecutor(_context())
    executor.execute(_batch())
    decode = _batch(
        token_ids=[99],
        positions=[3],
        slot_mapping=[7],
        query_start_loc=[0, 1],
        context_lens=[4],
        block_tables=[[1]],
        is_prefill=[False],
    )
    with pytest.raises(BatchInconsistency, match="unwritten slot"):
        executor.execute(decode)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="first_token_id"):
        MockExecutorOptions(first_token_id=10, vocab_size=5)
    with pytest.raises(ConfigError, match="exceeds the tokenizer"):
        MockExecutor(_context(vocab_size=1000))
