"""Triton paged decode attention (split-K flash decoding): a kernel microbenchmark on a CUDA GPU.

For batch x context in {1, 8, 32, 128} x {512, 2k, 8k, 16k, 32k}, a Qwen3-0.6B head layout (16 query
heads, 8 KV heads, head_dim 128) in fp16 with 16-token pages dealt to sequences in shuffled order,
it times (``triton.testing.do_bench``, after warm-up): ``split`` (the executor's split heuristic),
``split=1`` (no split-K), ``contiguous`` (the same kernel over KV laid out in order) and ``sdpa``
(torch's dense SDPA on the same data). Bandwidth = bytes of K and V read / time, against the
device's copy bandwidth measured in the same run. ``--smoke`` runs tiny shapes on Triton's CPU
interpreter to check the code path (no figures).
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import time

from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "Triton split-K paged decode kernel: time and bandwidth vs split=1, contiguous, SDPA"
NEEDS = "a CUDA GPU, torch with CUDA, triton and hetero-plugins-triton"
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 16, 8, 128, 16
BATCHES = (1, 8, 32, 128)
CONTEXTS = (512, 2048, 8192, 16384, 32768)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on Triton's CPU interpreter; no figures"
    )
    parser.add_argument(
        "--batches", type=int, nargs="+", metavar="B", help="batch sizes (default: 1 8 32 128)"
    )
    parser.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        metavar="C",
        help="context lengths (default: 512 2048 8192 16384 32768)",
    )


def run(args: argparse.Namespace) -> Report:
    for module, install in (
        ("torch", "pip install torch (a CUDA build)"),
        ("triton", "pip install triton"),
        ("hetero_plugins_triton", "pip install hetero-plugins-triton"),
    ):
        if importlib.util.find_spec(module) is None:
            raise HeteroError(f"the triton-decode benchmark needs {module}: {install}")
    import torch

    on_gpu = torch.cuda.is_available() and not args.smoke
    if not on_gpu and not args.smoke:
        raise HeteroError(
            "the triton-decode benchmark needs a CUDA GPU, and torch sees none here "
            "(torch.cuda.is_available() is False); --smoke checks the code on the CPU interpreter"
        )
    batches = args.batches or ((1, 2) if args.smoke else BATCHES)
    contexts = args.contexts or ((40, 160) if args.smoke else CONTEXTS)
    result = run_cases(batches, contexts, on_gpu=on_gpu)
    result["device"] = (
        torch.cuda.get_device_name() if on_gpu else f"{platform.processor() or 'cpu'} (interpreter)"
    )
    rows = result.pop("rows")
    columns = [
        Column("batch", "batch"),
        Column("context", "context"),
        Column("num_splits", "splits"),
        Column("split_us", "split µs", ".1f"),
        Column("bandwidth_gbs", "GB/s", ".0f"),
        Column("pct_of_copy", "% copy", ".0f"),
        Column("split1_us", "split=1 µs", ".1f"),
        Column("speedup_over_split1", "speedup", ".1f", "x"),
        Column("contiguous_us", "contig µs", ".1f"),
        Column("paged_over_contiguous", "paged/contig", ".2f"),
        Column("sdpa_us", "SDPA µs", ".1f"),
        Column("sdpa_over_split", "SDPA/split", ".2f", "x"),
    ]
    panels = [
        Panel(
            f"batch {b}: decode attention time",
            "µs",
            list(contexts),
            {
                label: [r[key] for r in rows if r["batch"] == b]
                for label, key in (("split-K", "split_us"), ("split=1", "split1_us"), ("SDPA", "sdpa_us"))
            },
            kind="line",
            xlabel="context tokens",
            log_x=True,
        )
        for b in batches[:4]
    ]
    header = [
        f"device: {result['device']}; copy bandwidth {result['copy_bandwidth_gbs']:.0f} GB/s (read + write)"
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "triton-decode",
        settings,
        Table(columns, rows),
        header,
        [],
        result,
        panels,
        title="Triton split-K paged decode attention",
    )


def run_cases(batches, contexts, on_gpu: bool) -> dict:
    import torch

    import hetero_plugins_triton

    interpret = not on_gpu
    hetero_plugins_triton.import_triton(interpret)  # before anything imports triton: it fixes the mode
    import triton

    from hetero_plugins_triton import choose_num_splits, decode_attention

    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.float16 if on_gpu else torch.float32
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 1
    measure = _timer(on_gpu)
    copy_bw = _copy_bandwidth(measure, device)
    scale, block_n = HEAD_DIM**-0.5, 64
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    for batch in batches:
        for context in contexts:
            query, key, value, tables, lens, qrows = _make_case(batch, context, dtype, device, shuffled=True)
            out = torch.empty_like(query)
            splits = choose_num_splits(
                max_context_len=context,
                num_seqs=batch,
                num_kv_heads=NUM_KV_HEADS,
                num_sms=num_sms,
                block_n=block_n,
            )

            def kernel(k=key, v=value, t=tables, n=splits, query=query, lens=lens, qrows=qrows, out=out):
                decode_attention(
                    query,
                    k,
                    v,
                    t,
                    lens,
                    qrows,
                    out,
                    scale=scale,
                    num_splits=n,
                    block_n=block_n,
                    interpret=interpret,
                )

            split_us = measure(kernel)
            reference = out.clone()
            one_us = measure(lambda kernel=kernel: kernel(n=1))
            ordered = _make_case(batch, context, dtype, device, shuffled=False)
            contig_us = measure(lambda ordered=ordered: kernel(k=ordered[1], v=ordered[2], t=ordered[3]))
            k, v = _dense(key, value, tables, context)
            q = query.unsqueeze(2)  # [batch, heads, 1, head_dim]
            sdpa_us = measure(lambda q=q, k=k, v=v: sdpa(q, k, v, enable_gqa=True))
            error = (sdpa(q, k, v, enable_gqa=True).squeeze(2).float() - reference.float()).abs().max().item()
            bandwidth = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * key.element_size() / (split_us * 1e-6)
            rows.append(
                dict(
                    batch=batch,
                    context=context,
                    num_splits=splits,
                    split_us=split_us,
                    bandwidth_gbs=bandwidth / 1e9,
                    pct_of_copy=100 * bandwidth / copy_bw,
                    split1_us=one_us,
                    speedup_over_split1=one_us / split_us,
                    contiguous_us=contig_us,
                    paged_over_contiguous=split_us / contig_us,
                    sdpa_us=sdpa_us,
                    sdpa_over_split=sdpa_us / split_us,
                    max_abs_error_vs_sdpa=error,
                )
            )
            del query, key, value, tables, ordered, k, v, out
            if on_gpu:
                torch.cuda.empty_cache()
    return {
        "copy_bandwidth_gbs": copy_bw / 1e9,
        "rows": rows,
        "versions": {"torch": torch.__version__, "triton": triton.__version__},
        "layout": {
            "num_heads": NUM_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "page": PAGE,
            "dtype": "float16" if on_gpu else "float32",
        },
    }


def _make_case(batch: int, context: int, dtype, device, shuffled: bool, seed: int = 0):
    import torch

    blocks_per_seq = -(-context // PAGE)
    num_blocks = batch * blocks_per_seq
    generator = torch.Generator(device=device).manual_seed(seed)
    key = torch.randn(
        (num_blocks, PAGE, NUM_KV_HEADS, HEAD_DIM), generator=generator, device=device, dtype=dtype
    )
    value = torch.randn_like(key)
    order = (
        torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
        if shuffled
        else torch.arange(num_blocks)
    )
    tables = order.view(batch, blocks_per_seq).to(device=device, dtype=torch.int32)
    query = torch.randn((batch, NUM_HEADS, HEAD_DIM), generator=generator, device=device, dtype=dtype)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    rows = torch.arange(batch, dtype=torch.int32, device=device)
    return query, key, value, tables, context_lens, rows


def _dense(key, value, tables, context: int):
    """[batch, kv_heads, context, head_dim] K and V in sequence order, for SDPA."""
    batch = tables.shape[0]
    k = (
        key[tables.long()]
        .reshape(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :context]
        .transpose(1, 2)
        .contiguous()
    )
    v = (
        value[tables.long()]
        .reshape(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :context]
        .transpose(1, 2)
        .contiguous()
    )
    return k, v


def _timer(on_gpu: bool):
    """Microseconds per call: triton's do_bench on a GPU, two plain calls on the interpreter."""
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


def _copy_bandwidth(measure, device) -> float:
    import torch

    n = (2 << 30) // 2 if device.type == "cuda" else 1 << 20
    src = torch.empty(n, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    micros = measure(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (micros * 1e-6)
