"""Prefix caching through the engine on the mock executor (which reads prompts back through the
block tables, so a wrong block reuse changes the output)."""

from hetero_core.engine.requests.params import SamplingParams

SYSTEM = "You are a helpful assistant. Answer briefly and politely. "  # 58 byte tokens
QUESTIONS = [SYSTEM + q for q in ("What is two plus two?", "Name a colour.", "Say hi.", "Count to 3.")]


def greedy(max_tokens=10):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def run_one_by_one(engine, prompts, params):
    return [engine.generate([p], params)[0] for p in prompts]


def test_later_requests_reuse_the_shared_prefix_and_produce_the_same_tokens(make_mock_engine):
    cached = make_mock_engine(block_size=8)
    plain = make_mock_engine(block_size=8, enable_prefix_caching=False)
    with_cache = run_one_by_one(cached, QUESTIONS, greedy())
    without = run_one_by_one(plain, QUESTIONS, greedy())
    assert [o.output_token_ids for o in with_cache] == [o.output_token_ids for o in without]
    stats = cached.stats()
    assert stats.prefix_cache_queried_tokens == sum(len(o.prompt_token_ids) for o in with_cache)
    assert stats.prefix_cache_hit_tokens == 3 * 56  # 7 full blocks of the system prompt, 3 times
    assert plain.stats().prefix_cache_queried_tokens == plain.stats().prefix_cache_hit_tokens == 0


def test_hits_skip_computation(make_mock_engine, recording):
    engine = make_mock_engine(block_size=8)
    rec = recording(engine)
    engine.generate([QUESTIONS[0]], greedy(2))
    rec.batches.clear()
    engine.generate([QUESTIONS[1]], greedy(2))
    prefill = rec.batches[0]
    assert prefill.num_computed_tokens(0) == 56 and prefill.query_len(0) == len(QUESTIONS[1]) - 56


def test_an_identical_block_aligned_prompt_shares_everything_and_copies_the_last_block(make_mock_engine):
    prompt = "x" * 32  # exactly four blocks of 8
    engine = make_mock_engine(block_size=8)
    steps = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: steps.append(schedule()) or steps[-1]
    first = engine.add_request(prompt, greedy(12))
    engine.step()
    engine.step()  # the first request is decoding, its prompt blocks cached and in use
    second = engine.add_request(prompt, greedy(12))
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in engine.step() if o.finished)
    step = steps[2]
    assert len(step.block_copies) == 1  # the shared last block is copied before its last token is rewritten
    assert step.batch.query_len(1) == 1 and step.batch.num_computed_tokens(1) == 31
    assert engine.stats().prefix_cache_hit_tokens == 31
    assert outputs[first].output_token_ids == outputs[second].output_token_ids
    assert engine.scheduler.allocator.num_free_blocks == engine.scheduler.allocator.num_blocks


def test_without_block_copies_the_last_token_is_never_served_from_a_shared_block(make_mock_engine):
    engine = make_mock_engine(block_size=8)
    engine.scheduler.can_copy_blocks = False  # as with an executor lacking copy_blocks
    prompt = "y" * 32
    engine.generate([prompt], greedy(2))
    engine.generate([prompt], greedy(2))
    assert engine.stats().prefix_cache_hit_tokens == 24  # three blocks; the fourth is recomputed


def test_preempted_requests_recompute_mostly_from_the_cache(make_mock_engine):
    prompts = [SYSTEM + f"question {i}" for i in range(8)]
    big = make_mock_engine(block_size=4).generate(prompts, greedy(24))
    engine = make_mock_engine(block_size=4, max_num_blocks=48, memory_threshold=1.0)
    small = engine.generate(prompts, greedy(24))
    stats = engine.stats()
    assert stats.num_recompute_preemptions > 0
    assert stats.prefix_cache_hit_tokens > 0
    assert [o.output_token_ids for o in small] == [o.output_token_ids for o in big]
