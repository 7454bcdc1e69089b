"""The decode split count: forced, or from context length, batch size and SM count."""

from hetero_plugins_triton.splits import MAX_SPLITS, MIN_TOKENS_PER_SPLIT, choose_num_splits

H100_SMS = 132


def splits(max_context_len, num_seqs, forced=None, num_kv_heads=8, num_sms=H100_SMS, block_n=64):
    return choose_num_splits(
        max_context_len=max_context_len,
        num_seqs=num_seqs,
        num_kv_heads=num_kv_heads,
        num_sms=num_sms,
        block_n=block_n,
        forced=forced,
    )


def test_one_long_sequence_is_split_to_fill_the_gpu():
    assert splits(16384, 1) == 33  # 8 KV heads x 33 splits >= 2 x 132 SMs


def test_large_batches_need_no_split():
    assert splits(8192, 128) == 1
    assert splits(8192, 32) == 2


def test_short_contexts_are_not_split_below_the_minimum_share():
    assert splits(MIN_TOKENS_PER_SPLIT - 1, 1) == 1
    assert splits(3 * MIN_TOKENS_PER_SPLIT, 1) == 3


def test_the_cap_and_a_device_with_few_sms():
    assert splits(1 << 20, 1, num_kv_heads=1) == MAX_SPLITS
    assert splits(4096, 1, num_kv_heads=2, num_sms=1) == 1


def test_a_forced_count_is_kept_up_to_one_split_per_tile():
    assert splits(16384, 1, forced=1) == 1
    assert splits(16384, 128, forced=7) == 7
    assert splits(100, 1, forced=8, block_n=64) == 2
