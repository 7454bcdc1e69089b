"""Mixed steps: several partial prefills in flight beside decodes, under the token budget, with
``max_prefill_chunk`` capping what one prompt takes per step."""

import pytest

from hetero_core.engine.requests.params import SamplingParams

LONG = ["a long prompt that needs several chunks " * 3 + str(i) for i in range(3)]  # ~120 tokens each


def greedy(max_tokens=8):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_several_partial_prefills_are_in_flight_at_once(make_mock_engine, recording):
    engine = make_mock_engine(max_prefill_chunk=16, max_total_tokens=64)
    rec = recording(engine)
    engine.generate(LONG, greedy(4))
    first = rec.batches[0]
    assert first.num_seqs == 3 and all(first.is_prefill)
    assert [first.query_len(i) for i in range(3)] == [16, 16, 16]
    assert not any(first.sample)  # all three are partial prefills, none finished yet
    assert all(b.query_len(i) <= 16 for b in rec.batches for i in range(b.num_seqs))


def test_long_prompts_never_hold_a_decode_back_for_more_than_one_chunk(make_mock_engine, recording):
    engine = make_mock_engine(max_prefill_chunk=8, max_total_tokens=20, max_num_blocks=256)
    rec = recording(engine)
    decoder = engine.add_request("short", greedy(30))
    engine.step()  # its prefill
    for prompt in LONG:
        engine.add_request(prompt, greedy(2))
    while engine.has_unfinished_requests():
        engine.step()
    decode_steps = [b for b in rec.batches[1:] if 0 in b.seq_ids]
    assert len(decode_steps) == 29  # one token per step, no step without it until it finished
    for batch in rec.batches:
        assert batch.num_tokens <= 20
        prefill_tokens = [batch.query_len(i) for i in range(batch.num_seqs) if batch.query_len(i) > 1]
        assert all(n <= 8 for n in prefill_tokens)
    mixed = rec.batches[1]
    assert mixed.seq_ids[0] == 0 and mixed.query_len(0) == 1  # the decode leads the step
    assert sum(mixed.is_prefill) >= 2  # and two prompts' chunks share it
    assert decoder


@pytest.mark.parametrize("chunk", [1, 3, 16, None])
def test_outputs_do_not_depend_on_the_chunk_size(make_mock_engine, chunk):
    whole = make_mock_engine(enable_prefix_caching=False).generate(LONG, greedy(6))
    chunked = make_mock_engine(max_prefill_chunk=chunk, max_total_tokens=40).generate(LONG, greedy(6))
    assert [o.output_token_ids for o in chunked] == [o.output_token_ids for o in whole]


def test_prefill_chunk_setting_is_validated():
    from hetero_core.errors import ConfigError
    from hetero_core.settings import load_settings

    with pytest.raises(ConfigError, match="max_prefill_chunk"):
        load_settings(max_prefill_chunk=0)
