"""The `contiguous` KV allocator (static max_model_len reservation): the allocator alone, its
consistency under random use, and the engine on the mock executor (same tokens as `paged`, fewer
requests at once, no prefix cache)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_core.default_plugins.policies import FcfsPolicy
from hetero_core.engine.kv.block_allocator import BlockAllocatorError
from hetero_core.engine.kv.contiguous_allocator import ContiguousBlockAllocator
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import ConfigError
from hetero_core.testing.policy_contract import TIGHT, WORKLOADS, SchedulerPolicyContract

PROMPTS = [f"request number {i} " * (1 + i % 5) for i in range(12)]


# -- the allocator ------------------------------------------------------------------------------------
def test_the_first_allocation_reserves_max_model_len_as_one_run_of_consecutive_blocks():
    allocator = ContiguousBlockAllocator(num_blocks=16, block_size=4, max_model_len=20)  # 5 blocks
    first, second = [], []
    allocator.allocate_slots(first, 0, 1)
    allocator.allocate_slots(second, 0, 7)
    assert first == [0, 1, 2, 3, 4] and second == [5, 6, 7, 8, 9]
    assert allocator.num_used_blocks == 10
    allocator.allocate_slots(second, 7, 13)  # anything up to max_model_len is already held
    assert second == [5, 6, 7, 8, 9] and allocator.num_used_blocks == 10


def test_a_fragmented_pool_gives_the_first_run_that_fits():
    allocator = ContiguousBlockAllocator(num_blocks=9, block_size=4, max_model_len=8)  # 2 blocks each
    tables = [[] for _ in range(4)]
    for table in tables:
        allocator.allocate_slots(table, 0, 1)  # [0 1] [2 3] [4 5] [6 7], free: 8
    allocator.free(tables[1])  # free: 2 3, 8
    allocator.free(tables[3])  # free: 2 3, 6 7 8
    later = []
    allocator.allocate_slots(later, 0, 5)  # 9 tokens would not fit two blocks; 5 do
    assert later == [2, 3]
    wide = []
    allocator.allocate_slots(wide, 0, 9)  # three blocks: the run 6 7 8
    assert wide == [6, 7, 8]


def test_without_a_run_that_fits_the_lowest_free_ids_are_taken():
    allocator = ContiguousBlockAllocator(num_blocks=6, block_size=2, max_model_len=2)  # 1 block each
    tables = [[] for _ in range(6)]
    for table in tables:
        allocator.allocate_slots(table, 0, 1)
    for i in (4, 0, 2):
        allocator.free(tables[i])  # free: 0, 2, 4
    long = []
    allocator.allocate_slots(long, 0, 5)  # three blocks, no run of three
    assert long == [0, 2, 4]


def test_free_returns_the_whole_reservation_and_it_declares_no_prefix_cache():
    allocator = ContiguousBlockAllocator(num_blocks=6, block_size=2, max_model_len=4)
    assert (
        not (allocator.has_prefix_cache or allocator.has_copy_on_write) and allocator.num_cached_blocks == 0
    )
    table = []
    allocator.allocate_slots(table, 0, 1)
    assert table == [0, 1] and allocator.num_free_blocks == 4 and allocator.ref_count(0) == 1
    allocator.cache_blocks(table, 4, lambda a, b: [7] * (b - a))  # nothing to cache
    assert allocator.get_computed_blocks([7] * 4).block_ids == ()
    allocator.free(table)
    assert allocator.num_free_blocks == 6 and allocator.ref_count(0) == 0


def test_a_reservation_below_the_request_grows_block_by_block_continuing_the_run():
    allocator = ContiguousBlockAllocator(num_blocks=10, block_size=4, max_model_len=8)
    table = []
    allocator.allocate_slots(table, 0, 3)
    assert table == [0, 1]
    allocator.allocate_slots(table, 3, 14)
    assert table == [0, 1, 2, 3, 4]


def test_a_request_asking_for_more_than_is_free_fails_without_taking_anything():
    allocator = ContiguousBlockAllocator(num_blocks=5, block_size=4, max_model_len=12)
    held = []
    allocator.allocate_slots(held, 0, 1)
    table = []
    assert allocator.allocate_slots(table, 0, 1) is None
    assert table == [] and allocator.num_free_blocks == 2


def test_double_free_and_foreign_blocks_are_refused():
    allocator = ContiguousBlockAllocator(num_blocks=4, block_size=4, max_model_len=8)
    table = []
    allocator.allocate_slots(table, 0, 1)
    stale = list(table)
    allocator.free(table)
    with pytest.raises(BlockAllocatorError, match="double free"):
        allocator.free(stale)
    with pytest.raises(BlockAllocatorError, match="outside the pool"):
        allocator.free([7])


def test_a_reservation_larger_than_the_pool_is_a_config_error_naming_the_fix():
    with pytest.raises(
        ConfigError, match=r"reserves max_model_len \(2048\).*128 blocks.*pool has 64.*max_num_blocks"
    ):
        ContiguousBlockAllocator(num_blocks=64, block_size=16, max_model_len=2048)


# -- the engine ---------------------------------------------------------------------------------------
def contiguous(**options):
    return {"name": "contiguous", "contiguous": options} if options else "contiguous"


def test_the_reservation_defaults_to_the_engines_max_model_len(make_mock_engine):
    engine = make_mock_engine(kv_allocator="contiguous", max_model_len=64, max_num_blocks=64, block_size=4)
    allocator = engine.scheduler.allocator
    assert isinstance(allocator, ContiguousBlockAllocator)
    assert allocator.max_model_len == 64 and allocator.num_reserved_blocks == 16
    set_here = make_mock_engine(
        kv_allocator=contiguous(max_model_len=32), max_model_len=64, max_num_blocks=64, block_size=4
    )
    assert set_here.scheduler.allocator.num_reserved_blocks == 8


def test_a_bad_option_is_a_config_error(make_mock_engine):
    with pytest.raises(ConfigError, match="kv_allocator.contiguous"):
        make_mock_engine(kv_allocator=contiguous(max_model_len=0))
    with pytest.raises(ConfigError, match="unknown setting"):
        make_mock_engine(kv_allocator=contiguous(reserve=3))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=20),
    ],
    ids=["greedy", "seeded"],
)
def test_contiguous_gives_the_same_tokens_as_paged(make_mock_engine, params):
    common = dict(max_num_blocks=128, block_size=4, max_model_len=128, enable_prefix_caching=False)
    paged = make_mock_engine(**common).generate(PROMPTS, params)
    engine = make_mock_engine(kv_allocator="contiguous", **common)
    outputs = engine.generate(PROMPTS, params)
    assert [o.output_token_ids for o in outputs] == [o.output_token_ids for o in paged]
    assert not any(o.failed for o in outputs)
    assert engine.scheduler.allocator.num_free_blocks == 128
    assert engine.stats().num_preemptions == 0  # a reservation never runs out


def peak_running(engine, prompts, params):
    for prompt in prompts:
        engine.add_request(prompt, params)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, len(engine.scheduler.running))
    return peak


def test_fewer_requests_run_at_once_in_the_same_pool(make_mock_engine):
    common = dict(max_num_blocks=128, block_size=4, max_model_len=128, memory_threshold=1.0)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    paged = peak_running(make_mock_engine(**common), PROMPTS, params)
    static = peak_running(make_mock_engine(kv_allocator="contiguous", **common), PROMPTS, params)
    assert static == 128 // 32  # four reservations of 32 blocks
    assert paged > static


def test_the_scheduler_sees_no_cached_prefix(make_mock_engine):
    engine = make_mock_engine(kv_allocator="contiguous", max_num_blocks=128, block_size=4, max_model_len=128)
    assert not engine.scheduler.prefix_caching
    shared = "the same long system prompt for everyone " * 2
    outputs = engine.generate([shared + "a", shared + "b"], SamplingParams(temperature=0, max_tokens=4))
    stats = engine.stats()
    assert stats.prefix_cache_hit_tokens == 0 and stats.prefix_cache_queried_tokens == 0
    assert [len(o.output_token_ids) for o in outputs] == [4, 4]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_short_reservation_can_preempt_and_still_gives_the_same_tokens(make_mock_engine, mode):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = make_mock_engine(max_num_blocks=1024, block_size=4).generate(PROMPTS, params)
    engine = make_mock_engine(
        kv_allocator=contiguous(max_model_len=8),
        max_num_blocks=32,
        block_size=4,
        memory_threshold=1.0,
        preemption_mode=mode,
    )
    outputs = engine.generate(PROMPTS, params)
    stats = engine.stats()
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swap_preemptions > 0 and stats.num_swap_ins == stats.num_swap_preemptions
    assert [o.output_token_ids for o in outputs] == [o.output_token_ids for o in reference]
    assert engine.scheduler.allocator.num_free_blocks == 32


def test_a_swapped_reservation_copies_only_its_computed_blocks(make_mock_engine):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts, priorities = ["low one " * 3, "low two " * 3, "urgent " * 2], [5, 5, 0]
    reference = make_mock_engine(max_num_blocks=1024, block_size=4).generate(prompts, params)
    engine = make_mock_engine(
        kv_allocator="contiguous",
        max_model_len=64,
        max_num_blocks=32,
        block_size=4,
        memory_threshold=1.0,
        scheduler_policy="priority",
        preemption_mode="swap",
    )
    for prompt, priority in zip(prompts[:2], priorities[:2]):
        engine.add_request(prompt, params, priority=priority)
    finished = {}
    for _ in range(3):
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    engine.add_request(prompts[2], params, priority=0)
    scheduler, swap_space = engine.scheduler, engine.scheduler.preemptor.swap_space
    while not scheduler.swapped:
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    victim = scheduler.swapped[0]
    assert swap_space.num_blocks - swap_space.num_free_blocks == -(-victim.num_computed_tokens // 4) < 16
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    outputs = [finished[r] for r in sorted(finished, key=int)]
    assert [o.output_token_ids for o in outputs] == [o.output_token_ids for o in reference]
    stats = engine.stats()
    assert stats.num_swap_ins == stats.num_swap_preemptions > 0 and scheduler.allocator.num_free_blocks == 32


# -- random workloads (the policy kit's generator and allocator checks, with the contiguous allocator) --
class FcfsKit(SchedulerPolicyContract):
    __test__ = False  # a helper: the kit's own tests run in test_policy_contract.py

    def make_policy(self):
        return FcfsPolicy()


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=WORKLOADS, mode=st.sampled_from(["recompute", "swap"]), reserve=st.sampled_from([None, 8, 24])
)
def test_random_workloads_keep_the_allocator_consistent_drain_and_match_paged(workload, mode, reserve):
    """Arrivals over time, aborts (also during prefill), chunked prefill, and with a short reservation
    growth, preemption and swap: after every step counts equal owners and free + used = total
    (``run_workload`` checks it); every request ends; tokens equal those of ``paged``."""
    kit = FcfsKit()
    allocator = contiguous(max_model_len=reserve) if reserve else "contiguous"
    result = kit.run_workload(
        workload,
        **{**TIGHT, "max_num_blocks": 48},
        kv_allocator=allocator,
        preemption_mode=mode,
        num_swap_blocks=8,
    )
    paged = kit.run_workload(workload, **{**TIGHT, "max_num_blocks": 512})
    assert all(o.finished for o in result.outputs.values())
    for output, reference in zip(result.outputs.values(), paged.outputs.values()):
        if output.finish_reason != "abort" and reference.finish_reason != "abort":
            assert output.output_token_ids == reference.output_token_ids
