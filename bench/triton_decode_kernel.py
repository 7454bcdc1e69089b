"""Triton paged decode attention (split-K flash decoding): a kernel microbenchmark.

For batch x context in {1, 8, 32, 128} x {512, 2k, 8k, 16k, 32k}, a Qwen3-0.6B-like head layout (16 query
heads, 8 KV heads, head_dim 128) in fp16 with 16-token pages dealt to sequences in shuffled order, it times
(``triton.testing.do_bench``, after warm-up):

- ``split``: the kernel with the executor's own split heuristic (``choose_num_splits``, from the SM count);
- ``split=1``: the same kernel without split-K (the baseline);
- ``contiguous``: the split kernel on the same KV laid out in order (each sequence's pages back to back);
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on the same data made dense.

Bandwidth is the bytes of K and V the step must read over the time, against the device's copy bandwidth
measured in the same run (a device-to-device ``copy_`` of 2 GiB, bytes read + written over the time).
Targets (issue 10): >= 70% of copy bandwidth once batch x context >= 1M tokens; >= 5x over split=1 at
batch 1, context 16k; paged within 10% of contiguous.

    python bench/triton_decode_kernel.py [--json results.json]
    TRITON_INTERPRET=1 python bench/triton_decode_kernel.py --smoke     # tiny shapes on the CPU interpreter
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 16, 8, 128, 16
BATCHES = (1, 8, 32, 128)
CONTEXTS = (512, 2048, 8192, 16384, 32768)


def make_case(batch: int, context: int, dtype, device, shuffled: bool, seed: int = 0):
    import torch

    blocks_per_seq = -(-context // PAGE)
    num_blocks = batch * blocks_per_seq
    generator = torch.Generator(device=device).manual_seed(seed)
    key = torch.randn((num_blocks, PAGE, NUM_KV_HEADS, HEAD_DIM), generator=generator, device=device, dtype=dtype)
    value = torch.randn_like(key)
    order = (torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)) if shuffled
             else torch.arange(num_blocks))
    tables = order.view(batch, blocks_per_seq).to(device=device, dtype=torch.int32)
    query = torch.randn((batch, NUM_HEADS, HEAD_DIM), generator=generator, device=device, dtype=dtype)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    rows = torch.arange(batch, dtype=torch.int32, device=device)
    return query, key, value, tables, context_lens, rows


def dense(key, value, tables, context: int):
    """[batch, kv_heads, context, head_dim] K and V in sequence order, for SDPA."""
    batch = tables.shape[0]
    k = key[tables.long()].reshape(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2).contiguous()
    v = value[tables.long()].reshape(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2).contiguous()
    return k, v


def timer(on_gpu: bool):
    if on_gpu:
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100) * 1e3  # ms -> µs

    def cpu_time(fn, repeats: int = 2) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats * 1e6

    return cpu_time


def copy_bandwidth(measure, device) -> float:
    import torch

    n = (2 << 30) // 2 if device.type == "cuda" else 1 << 20
    src = torch.empty(n, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    micros = measure(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (micros * 1e-6)


def run(batches, contexts, on_gpu: bool, interpret: bool) -> dict:
    import torch

    from hetero_plugins_triton.kernels.compile import import_triton

    import_triton(interpret)
    from hetero_plugins_triton.kernels.decode_attention import decode_attention
    from hetero_plugins_triton.splits import choose_num_splits

    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.float16 if on_gpu else torch.float32
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 1
    measure = timer(on_gpu)
    copy_bw = copy_bandwidth(measure, device)
    print(f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write)")
    scale, block_n = HEAD_DIM ** -0.5, 64
    rows = []
    header = (f"{'batch':>5} {'context':>7} {'splits':>6} {'split µs':>9} {'GB/s':>6} {'%copy':>6} "
              f"{'split=1 µs':>10} {'speedup':>7} {'contig µs':>9} {'paged/contig':>12} {'sdpa µs':>8} {'sdpa/split':>10}")
    print(header)
    for batch in batches:
        for context in contexts:
            query, key, value, tables, lens, qrows = make_case(batch, context, dtype, device, shuffled=True)
            out = torch.empty_like(query)
            splits = choose_num_splits(max_context_len=context, num_seqs=batch, num_kv_heads=NUM_KV_HEADS,
                                       num_sms=num_sms, block_n=block_n)

            def kernel(k=key, v=value, t=tables, n=splits):
                decode_attention(query, k, v, t, lens, qrows, out, scale=scale, num_splits=n, block_n=block_n,
                                 interpret=interpret)

            split_us = measure(kernel)
            reference = out.clone()
            one_us = measure(lambda: kernel(n=1))
            ordered = make_case(batch, context, dtype, device, shuffled=False)
            contig_us = measure(lambda: kernel(k=ordered[1], v=ordered[2], t=ordered[3]))
            k, v = dense(key, value, tables, context)
            q = query.unsqueeze(2)  # [batch, heads, 1, head_dim]
            sdpa = torch.nn.functional.scaled_dot_product_attention
            sdpa_us = measure(lambda: sdpa(q, k, v, enable_gqa=True))
            error = (sdpa(q, k, v, enable_gqa=True).squeeze(2).float() - reference.float()).abs().max().item()
            kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * key.element_size()
            bandwidth = kv_bytes / (split_us * 1e-6)
            row = dict(batch=batch, context=context, num_splits=splits, split_us=split_us, bandwidth_gbs=bandwidth / 1e9,
                       pct_of_copy=100 * bandwidth / copy_bw, split1_us=one_us, speedup_over_split1=one_us / split_us,
                       contiguous_us=contig_us, paged_over_contiguous=split_us / contig_us, sdpa_us=sdpa_us,
                       sdpa_over_split=sdpa_us / split_us, max_abs_error_vs_sdpa=error)  # fmt: skip
            rows.append(row)
            print(f"{batch:>5} {context:>7} {splits:>6} {split_us:>9.1f} {bandwidth / 1e9:>6.0f} "
                  f"{row['pct_of_copy']:>5.0f}% {one_us:>10.1f} {row['speedup_over_split1']:>6.1f}x "
                  f"{contig_us:>9.1f} {row['paged_over_contiguous']:>12.2f} {sdpa_us:>8.1f} "
                  f"{row['sdpa_over_split']:>9.2f}x")
            del query, key, value, tables, ordered, k, v, out
            if on_gpu:
                torch.cuda.empty_cache()
    return {"copy_bandwidth_gbs": copy_bw / 1e9, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter); not for figures")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    import torch

    on_gpu = torch.cuda.is_available() and not args.smoke
    if not on_gpu and not args.smoke:
        parser.error("this benchmark needs a CUDA GPU; run with --smoke (and TRITON_INTERPRET=1) on a CPU")
    batches, contexts = ((1, 2), (40, 160)) if args.smoke else (BATCHES, CONTEXTS)
    result = run(batches, contexts, on_gpu=on_gpu, interpret=not on_gpu)
    import triton

    result.update(
        device=torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu (interpreter)",
        versions={"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__},
        layout={"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM, "page": PAGE,
                "dtype": "float16" if on_gpu else "float32"},
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
