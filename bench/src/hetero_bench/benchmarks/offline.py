"""Offline throughput: Hetero's engine against peers (HF generate, ...) on the same workload and machine.

Hetero and each peer run the same requests (``workload.py``: 32 random-token prompts of 16-128
tokens, 16-64 output tokens each, greedy, EOS ignored), alternately, for ``--rounds`` rounds; each
peer's figure is the median over the rounds and is printed with its ratio to Hetero. Then, with
``--decode-tokens N``, the batch-1 decode latency (ms per token after the prefill) of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap

from hetero_bench.options import add_engine_arguments, engine_settings, non_negative_int, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "offline throughput of the engine vs HF generate (and other peers), same workload"
NEEDS = "torch and the model for real figures (--executor mock runs without them); transformers for hf"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peers",
        default="hf",
        metavar="A,B",
        help="peers to run beside Hetero, comma-separated, or 'none' (default: hf; see the list below)",
    )
    parser.add_argument(
        "--num-requests", type=positive_int, default=32, metavar="N", help="requests (default: 32)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the workload's random seed (default: 0)")
    parser.add_argument(
        "--prompt-len",
        type=positive_int,
        nargs=2,
        default=(16, 128),
        metavar=("MIN", "MAX"),
        help="prompt lengths, uniform (default: 16 128)",
    )
    parser.add_argument(
        "--output-len",
        type=positive_int,
        nargs=2,
        default=(16, 64),
        metavar=("MIN", "MAX"),
        help="output lengths, uniform (default: 16 64)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        metavar="N",
        help="Hetero and every peer run this many times, alternately (default: 3)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=non_negative_int,
        default=64,
        metavar="N",
        help="batch-1 decode latency over this many tokens (0: skip; default: 64)",
    )
    parser.add_argument(
        "--hf-batch-size",
        type=positive_int,
        default=32,
        metavar="N",
        help="the hf peer's static batch size (default: 32)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="torch threads for every peer (default: the engine's choice)",
    )
    parser.add_argument(
        "--ceiling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the GEMM ceiling (fp32, bf16 torch.matmul) and every peer's achieved "
        "GFLOP/s on the workload's matmuls (default: on; needs a real model)",
    )
    parser.add_argument(
        "--first-token-runs",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="also time Hetero's load to first token: `hetero run --max-tokens 1` in N fresh "
        "processes, median (default: 0, skip); peers that start a process (vLLM) "
        "report theirs anyway",
    )
    parser.add_argument(
        "--emulate-avx2",
        action="store_true",
        help="cap torch, oneDNN, MKL and Hetero's C kernels at AVX2, here and in the peers' "
        "processes: an AVX2-only CPU approximated on an AVX-512 one (docs/benchmarks.md)",
    )
    add_engine_arguments(parser)


def epilog() -> str:
    from hetero_bench.peers import available_peers

    return "peers: " + ", ".join(available_peers())


def run(args: argparse.Namespace) -> Report:
    from hetero_bench.peers import PeerContext, PeerUnavailable, available_peers
    from hetero_bench.peers.hetero_engine import HeteroPeer
    from hetero_bench.workload import Workload

    if args.emulate_avx2:
        from hetero_bench.avx2_emulation import emulate_avx2

        emulate_avx2()
    factories = available_peers()
    names = (
        []
        if args.peers.strip() == "none"
        else list(dict.fromkeys(n.strip() for n in args.peers.split(",") if n.strip()))
    )
    for name in names:
        if name not in factories:
            raise HeteroError(f"unknown peer {name!r}; available: {', '.join(factories)}")
    for flag, (low, high) in (("--prompt-len", args.prompt_len), ("--output-len", args.output_len)):
        if low > high:
            raise HeteroError(f"{flag} {low} {high}: MIN must not exceed MAX")
    workload = Workload(args.num_requests, args.seed, tuple(args.prompt_len), tuple(args.output_len))
    # Off: the random prompts share no prefix, so the cache could only reuse an earlier round's work.
    hetero = HeteroPeer(engine_settings(args, enable_prefix_caching=False))
    requests = workload.requests(hetero.vocab_size)
    arithmetic = _arithmetic(hetero, requests) if args.ceiling else {}
    context = PeerContext(hetero.model_dir, hetero.dtype, args.threads, args.hf_batch_size)
    peers, skipped = [hetero], {}
    for name in names:
        try:
            peers.append(factories[name](context))
        except PeerUnavailable as exc:
            skipped[name] = str(exc)
            print(f"hetero bench: skipping peer {name!r}: {exc}", file=sys.stderr)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        rounds, tokens = _run_rounds(peers, requests, args.rounds, skipped)
        ran = [p for p in peers if p.name not in skipped]
        latency = _decode_latency(ran, requests[0].prompt_token_ids, args.decode_tokens)
        first_token = {p.name: p.first_token_s for p in ran if getattr(p, "first_token_s", None) is not None}
        if args.first_token_runs:
            first_token["hetero"] = _hetero_first_token_s(args)
    finally:
        for peer in peers:
            getattr(peer, "close", lambda: None)()
    report = _report(args, workload, requests, hetero, ran, rounds, latency, skipped, arithmetic, first_token)
    report.summary.extend(_agreement(ran, tokens))
    return report


def _arithmetic(hetero, requests) -> dict:
    """The workload's matmul FLOPs and this machine's GEMM ceilings (empty without a real model)."""
    if hetero.model_dir is None:
        return {}
    import json

    from hetero_bench.flops import gemm_ceiling_gflops, workload_flops

    config = json.loads((hetero.model_dir / "config.json").read_text())
    ceilings = {dtype: gemm_ceiling_gflops(dtype) for dtype in ("float32", "bfloat16")}
    return {
        "workload_tflop": workload_flops(config, requests) / 1e12,
        "gemm_ceiling_gflops": {dtype: rate for dtype, (rate, _) in ceilings.items()},
        "gemm_ceiling_sizes": {dtype: size for dtype, (_, size) in ceilings.items()},
    }


def _hetero_first_token_s(args) -> float:
    from hetero_bench.benchmarks.warm_start import timed_run
    from hetero_bench.options import engine_flags

    flags = engine_flags(args)
    timed_run(flags)  # the page cache warm, as for every later start
    return statistics.median(timed_run(flags)[0] for _ in range(args.first_token_runs))  # wall seconds


def _agreement(peers, tokens: dict[str, list[list[int]]]) -> list[str]:
    """For each peer that returned its tokens: how many requests got exactly Hetero's greedy tokens."""
    lines = []
    for peer in peers[1:]:
        if peer.name in tokens and "hetero" in tokens:
            same = sum(a == b for a, b in zip(tokens["hetero"], tokens[peer.name], strict=True))
            lines.append(
                f"{peer.label}: greedy tokens identical to hetero's in {same}/{len(tokens['hetero'])} "
                "requests (expect all only in the same dtype)"
            )
    return lines


def _run_rounds(peers, requests, num_rounds: int, skipped: dict[str, str]) -> tuple[list[dict], dict]:
    """Every peer once per round, Hetero first: (each round's results by peer, each peer's last
    token ids where it returned them). A peer whose run raises PeerUnavailable (found out only when
    it starts, say) is dropped from every round with one line."""
    from hetero_bench.peers import PeerUnavailable

    rounds, tokens = [], {}
    for number in range(1, num_rounds + 1):
        results = {}
        for peer in peers:
            if peer.name in skipped:
                continue
            try:
                results[peer.name] = result = peer.run(requests)
                if "token_ids" in result.extra:  # kept for the agreement line, not the JSON
                    tokens[peer.name] = result.extra.pop("token_ids")
            except PeerUnavailable as exc:
                skipped[peer.name] = str(exc)
                print(f"hetero bench: skipping peer {peer.name!r}: {exc}", file=sys.stderr)
                continue
            print(
                f"round {number}/{num_rounds}: {peer.label}: {result.elapsed_s:.2f} s, "
                f"{result.tokens_per_s:.1f} output tokens/s",
                file=sys.stderr,
            )
        rounds.append(results)
    return [{name: r for name, r in results.items() if name not in skipped} for results in rounds], tokens


def _decode_latency(peers, prompt: list[int], num_tokens: int) -> dict[str, float]:
    if not num_tokens:
        return {}
    return {p.name: p.decode_latency(prompt, num_tokens) for p in peers if hasattr(p, "decode_latency")}


def _report(
    args, workload, requests, hetero, peers, rounds, latency, skipped, arithmetic, first_token
) -> Report:
    expected = sum(r.max_tokens for r in requests)
    rows, per_peer = [], {}
    for peer in peers:
        elapsed = statistics.median(r[peer.name].elapsed_s for r in rounds)
        tps = _median_tps(rounds, peer.name)
        per_round = [r["hetero"].tokens_per_s / r[peer.name].tokens_per_s for r in rounds]
        ms = latency.get(peer.name)
        row = {
            "peer": peer.name,
            "label": peer.label,
            "seconds": elapsed,
            "output_tokens_per_s": tps,
            "hetero_speedup": statistics.median(per_round),  # paired: each round's ratio, then the median
            "decode_ms_per_token": None if ms is None else ms * 1e3,
            "hetero_decode_speedup": (ms / latency["hetero"])
            if ms is not None and "hetero" in latency
            else None,
            "gflops": arithmetic["workload_tflop"] * 1e3 / elapsed if arithmetic else None,
            "first_token_s": first_token.get(peer.name),
            "rss_mb": rounds[-1][peer.name].extra.get("rss_mb"),
        }  # resident memory after the last round
        rows.append(row)
        per_peer[peer.name] = {
            **row,
            "hetero_speedup_per_round": per_round,
            "rounds": [
                {
                    "elapsed_s": r[peer.name].elapsed_s,
                    "output_tokens": r[peer.name].output_tokens,
                    **r[peer.name].extra,
                }
                for r in rounds
            ],
        }
    columns = [
        Column("label", "peer"),
        Column("seconds", "time s", ".2f"),
        Column("output_tokens_per_s", "out tok/s", ".1f"),
        Column("hetero_speedup", "hetero speedup", ".2f", "x"),
    ]
    if latency:
        columns += [
            Column("decode_ms_per_token", "batch-1 ms/tok", ".1f"),
            Column("hetero_decode_speedup", "hetero speedup", ".2f", "x"),
        ]
    if arithmetic:
        columns.append(Column("gflops", "GFLOP/s", ".0f"))
    if first_token:
        columns.append(Column("first_token_s", "load->1st token s", ".2f"))
    if any(row["rss_mb"] is not None for row in rows):
        columns.append(Column("rss_mb", "RSS MiB", ".0f"))
    summary = [
        f"hetero speedup = hetero output tokens/s / the peer's in the same round (median of {len(rounds)})"
        + ("; batch-1: the peer's ms/token / hetero's" if latency else "")
    ]
    for peer in peers[1:]:
        ratios = per_peer[peer.name]["hetero_speedup_per_round"]
        summary.append(f"{peer.label}: hetero speedup per round " + ", ".join(f"{x:.2f}x" for x in ratios))
    if arithmetic:
        ceiling = arithmetic["gemm_ceiling_gflops"]
        sizes = arithmetic["gemm_ceiling_sizes"]
        summary.append(
            f"workload matmuls {arithmetic['workload_tflop']:.3f} TFLOP; GEMM ceiling in this run "
            f"(torch.matmul n^3): fp32 {ceiling['float32']:.0f} GFLOP/s (n={sizes['float32']}), "
            f"bf16 {ceiling['bfloat16']:.0f} GFLOP/s (n={sizes['bfloat16']})"
        )
    if any(row["rss_mb"] is not None for row in rows):
        summary.append(
            "RSS: resident memory after the last round (hetero: the benchmark's process, in-process "
            "peers included; vLLM: its worker's process group)"
        )
    if first_token:
        summary.append(
            "load->1st token: a fresh process to its first generated token (imports, weights, "
            "compilation, the prefill), the model files already converted and cached"
        )
    short = [p for p in peers for r in rounds if r[p.name].output_tokens != expected]
    if short:
        summary.append(
            f"warning: {short[0].label} produced a different number of tokens than the {expected} asked"
        )
    header = [
        f"workload: {len(requests)} requests, "
        f"{sum(len(r.prompt_token_ids) for r in requests)} prompt tokens, "
        f"{expected} output tokens, greedy, ignore_eos; executor {hetero.executor_name}, "
        f"dtype {hetero.dtype or '-'}; {len(rounds)} round(s)"
    ]
    panels = plot_panels(rows)
    settings = {
        **{k: v for k, v in vars(args).items() if k not in ("handler", "json", "plot")},
        "workload": workload.as_dict(),
        "executor_resolved": hetero.executor_name,
        "dtype_resolved": hetero.dtype,
        "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "output_tokens": expected,
    }
    return Report(
        "offline",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"peers": per_peer, "skipped_peers": skipped, **arithmetic},
        panels,
        title=f"Offline throughput: {len(requests)} requests, {expected} output tokens",
    )


def _median_tps(rounds, name: str) -> float:
    return statistics.median(r[name].tokens_per_s for r in rounds)


def plot_panels(rows: list[dict]) -> list[Panel]:
    """Throughput bars, and batch-1 latency bars when measured (from the table's rows)."""
    panels = [
        Panel(
            "output throughput (higher is better)",
            "output tokens/s",
            [_label(r, "hetero_speedup") for r in rows],
            {"tokens/s": [r["output_tokens_per_s"] for r in rows]},
        )
    ]
    timed = [r for r in rows if r["decode_ms_per_token"] is not None]
    if timed:
        panels.append(
            Panel(
                "batch-1 decode latency (lower is better)",
                "ms per token",
                [_label(r, "hetero_decode_speedup") for r in timed],
                {"ms/token": [r["decode_ms_per_token"] for r in timed]},
            )
        )
    return panels


def _label(row: dict, ratio: str) -> str:
    """A bar's label: the peer, wrapped, and for the others Hetero's speedup over it."""
    label = textwrap.fill(row["label"], 16)
    if row["peer"] == "hetero" or row[ratio] is None:
        return label
    return f"{label}\n(hetero {row[ratio]:.2f}x)"
