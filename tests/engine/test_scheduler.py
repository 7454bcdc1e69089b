"""Scheduler behaviour through the engine on the mock executor (which checks every batch)."""

from hetero_core.engine.requests.params import SamplingParams

PROMPTS = [f"request number {i} " * (1 + i % 5) for i in range(12)]


def greedy(max_tokens=8, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def test_every_step_respects_the_budgets(make_mock_engine, recording):
    engine = make_mock_engine(max_batch_size=4, max_total_tokens=64, max_num_seqs=6, max_num_blocks=64)
    rec = recording(engine)
    running_counts = []
    for prompt in PROMPTS:
        engine.add_request(prompt, greedy(12))
    while engine.has_unfinished_requests():
        engine.step()
        running_counts.append(len(engine.scheduler.running))
    assert rec.batches
    assert max(b.num_seqs for b in rec.batches) == 4
    assert all(b.num_tokens <= 64 for b in rec.batches)
    assert max(running_counts) <= 6


def test_decodes_come_first_and_are_never_starved_by_prefills(make_mock_engine, recording):
    engine = make_mock_engine(max_batch_size=8, max_total_tokens=40, max_num_blocks=256)
    rec = recording(engine)
    engine.add_request("a" * 10, greedy(20))
    engine.step()  # prefill of the first request
    for prompt in PROMPTS:
        engine.add_request(prompt, greedy(4))
    engine.step()
    batch = rec.batches[-1]
    assert batch.seq_ids[0] == 0 and not batch.is_prefill[0]  # the decode leads
    assert any(batch.is_prefill[1:])  # prefills fill the rest of the step


def test_schedule_is_deterministic(make_mock_engine, recording):
    def run():
        engine = make_mock_engine(max_batch_size=3, max_total_tokens=50, max_num_blocks=20, block_size=4)
        rec = recording(engine)
        outputs = engine.generate(PROMPTS, greedy(10))
        return [(b.seq_ids, b.token_ids, b.slot_mapping) for b in rec.batches], [o.text for o in outputs]

    assert run() == run()


def test_impossible_request_fails_alone_at_admission(make_mock_engine):
    engine = make_mock_engine(max_model_len=64, max_num_blocks=64)
    outputs = engine.generate(["short one", "x" * 60, "another short one"], greedy(8))
    ok1, bad, ok2 = outputs
    assert bad.failed and "exceeds max_model_len (64)" in bad.error
    assert not ok1.failed and len(ok1.output_token_ids) == 8
    assert not ok2.failed and len(ok2.output_token_ids) == 8


def test_request_larger_than_the_whole_pool_fails_alone(make_mock_engine):
    engine = make_mock_engine(max_num_blocks=4, block_size=4, max_model_len=2048)
    outputs = engine.generate(["tiny", "y" * 40], greedy(4))
    assert not outputs[0].failed
    assert "whole pool has 4" in outputs[1].error


def test_abort_mid_decode_frees_blocks_and_others_finish(make_mock_engine):
    engine = make_mock_engine(max_num_blocks=32, block_size=4)
    allocator = engine.scheduler.allocator
    keep = engine.add_request("keep me", greedy(12))
    drop = engine.add_request("drop me please", greedy(50))
    for _ in range(4):
        engine.step()
    assert engine.abort(drop)
    assert not engine.abort(drop)  # already done
    assert allocator.num_used_blocks == len(engine.scheduler.running[0].block_table)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert finished[keep].finish_reason == "length" and len(finished[keep].output_token_ids) == 12
    assert allocator.num_free_blocks == allocator.num_blocks


def test_abort_reports_once(make_mock_engine):
    engine = make_mock_engine()
    rid = engine.add_request("hello", greedy(30))
    engine.step()
    engine.abort(rid)
    outputs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [(rid, "abort")]
    assert engine.step() == []


def test_preemption_under_a_tiny_pool_gives_the_same_tokens(make_mock_engine):
    big = make_mock_engine(max_num_blocks=1024, block_size=4).generate(PROMPTS, greedy(24))
    small_engine = make_mock_engine(max_num_blocks=32, block_size=4, memory_threshold=1.0)
    small = small_engine.generate(PROMPTS, greedy(24))
    assert sum(o.num_preemptions for o in small) > 0
    assert not any(o.failed for o in small)
    assert [o.output_token_ids for o in small] == [o.output_token_ids for o in big]
    assert all(o.finish_reason == "length" for o in small)
    assert small_engine.scheduler.allocator.num_free_blocks == 32


def test_long_prompt_is_prefilled_in_chunks_with_the_same_result(make_mock_engine, recording):
    prompt = "chunk me " * 30  # 270 byte tokens
    whole = make_mock_engine(max_total_tokens=4096).generate([prompt], greedy(6))[0]
    engine = make_mock_engine(max_total_tokens=64)
    rec = recording(engine)
    chunked = engine.generate([prompt], greedy(6))[0]
    prefill_steps = [b for b in rec.batches if b.is_prefill[0]]
    assert len(prefill_steps) == 5  # 64 * 4 + 14
    assert [b.sample[0] for b in prefill_steps] == [False] * 4 + [True]
    assert chunked.output_token_ids == whole.output_token_ids


def test_memory_threshold_holds_back_new_requests_while_others_run(make_mock_engine, recording):
    engine = make_mock_engine(max_num_blocks=10, block_size=4, memory_threshold=0.5)
    rec = recording(engine)
    engine.generate(["a" * 12, "b" * 12, "c" * 12], greedy(4))  # 4 blocks each with output
    first = rec.batches[0]
    assert first.seq_ids == [0]  # the second would push use above 5 of 10 blocks


def test_outputs_do_not_depend_on_batch_composition(make_mock_engine):
    alone = make_mock_engine().generate([PROMPTS[3]], greedy(10))[0]
    crowd = make_mock_engine(max_batch_size=2).generate(PROMPTS, greedy(10))[3]
    assert crowd.output_token_ids == alone.output_token_ids


def test_decodes_go_before_an_older_sequence_that_is_prefilling_again():
    from hetero_core.default_plugins.policies import FcfsPolicy
    from hetero_core.engine.kv.block_allocator import PagedBlockAllocator
    from hetero_core.engine.requests.sequence import Sequence, SequenceStatus
    from hetero_core.engine.scheduling.scheduler import Scheduler, SchedulerLimits

    allocator = PagedBlockAllocator(64, 4)
    limits = SchedulerLimits(
        max_batch_size=8, max_num_seqs=8, max_total_tokens=8, max_model_len=256, memory_threshold=1.0
    )
    scheduler = Scheduler(FcfsPolicy(), allocator, limits)
    older = Sequence(
        0, "old", "", list(range(20)), greedy(8), 0.0, output_token_ids=[1, 2], status=SequenceStatus.PREFILL
    )  # preempted earlier: recomputing 22 tokens
    newer = Sequence(
        1,
        "new",
        "",
        list(range(5)),
        greedy(8),
        0.0,
        output_token_ids=[3],
        status=SequenceStatus.DECODE,
        num_computed_tokens=5,
    )
    allocator.allocate_slots(newer.block_table, 0, 5)
    scheduler.running = [older, newer]
    step = scheduler.schedule()
    assert step.batch.seq_ids == [1, 0]
    assert step.num_new_tokens == [1, 7]
    assert step.batch.sample == [True, False]
