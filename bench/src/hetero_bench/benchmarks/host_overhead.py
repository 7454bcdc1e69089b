"""The engine's own time per step (host overhead), on the ``null`` executor, which does no work.

Workload (issue 25): N requests of 100-400 random prompt tokens and 128 output tokens each (greedy,
EOS ignored), queued at once with room for all of them to run together (``max_batch_size`` =
``max_num_seqs`` = N, 32 KV blocks and 256 tokens of step budget per request, no prefix cache),
added as ``generate`` adds them (final outputs only) and stepped to the end. Per N: the engine's time
per step (every step's wall time less the executor's), per running sequence per step, the ceiling
it puts on throughput (output tokens per second of engine time: what a device with free steps would
reach), and the split by phase (``engine.timings``: schedule, build batch, postprocess, outputs).

Every run is a fresh process (``host_overhead_run``). ``--baseline DIR`` (a checkout of an older
Hetero, or its ``core/``) runs the same workload on that engine in alternate rounds (baseline, this,
baseline, this, ...) and reports the median per-round speedup. ``--step-time`` models a GPU: the
executor sleeps that long per step, and the wall time per step is compared with async scheduling
off and on (the next step scheduled while the device runs), also in alternate rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from hetero_bench.host_overhead_run import PHASES, measure_in
from hetero_bench.options import non_negative_float, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "the engine's own time per step at 32-1024 sequences (null executor), and overlap with a device"
NEEDS = "hetero-plugins-mock"
TARGETS = (
    "targets (2-core machine): <= 2.5 ms per step at 256 sequences (>= 100k tok/s), <= 10 µs/seq/step at 1024"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-seqs",
        type=positive_int,
        nargs="+",
        default=[32, 256, 1024],
        metavar="N",
        help="running sequences to measure (default: 32 256 1024)",
    )
    parser.add_argument("--output-tokens", type=positive_int, default=128, help="per request (default: 128)")
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="runs per setting; medians (default: 3)"
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        default=None,
        help="a checkout of another Hetero (or its core/) to measure in alternate rounds",
    )
    parser.add_argument(
        "--step-time",
        type=non_negative_float,
        default=0.0,
        metavar="MS",
        help="simulated device milliseconds per step: adds rows with async scheduling off "
        "and on (default: 0, none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the prompts' random seed (default: 0)")


def run(args: argparse.Namespace) -> Report:
    baseline = _baseline_core(args.baseline) if args.baseline else None
    sides = {"baseline": baseline, "this": None} if baseline else {"this": None}
    rows, comparisons, overlap = [], [], []
    for n in args.num_seqs:
        runs = {side: [] for side in sides}
        for r in range(args.rounds):
            for side, core in sides.items():
                _progress(f"{n} seqs, round {r + 1}/{args.rounds}: {side}")
                runs[side].append(
                    measure_in(core, num_seqs=n, output_tokens=args.output_tokens, seed=args.seed + r)
                )
        for side in sides:
            rows.append({"num_seqs": n, "engine": side, **_median_row(runs[side])})
        if baseline:
            ratios = [
                b["engine_ms_per_step"] / t["engine_ms_per_step"]
                for b, t in zip(runs["baseline"], runs["this"])
            ]
            cpu = [
                b["cpu_ms_per_step"] / t["cpu_ms_per_step"] for b, t in zip(runs["baseline"], runs["this"])
            ]
            comparisons.append(
                {
                    "num_seqs": n,
                    "speedup": statistics.median(ratios),
                    "rounds": ratios,
                    "cpu_speedup": statistics.median(cpu),
                    "cpu_rounds": cpu,
                }
            )
        if args.step_time:
            overlap.append(_overlap(n, args))
    columns = [
        Column("num_seqs", "seqs"),
        Column("engine", "engine"),
        Column("steps", "steps"),
        Column("engine_ms_per_step", "engine ms/step", ".2f"),
        Column("us_per_seq_step", "µs/seq/step", ".2f"),
        Column("cpu_ms_per_step", "CPU ms/step", ".2f"),
        Column("ceiling_tok_s", "ceiling tok/s", ",.0f"),
        *[Column(f"{p}_ms", f"{p.replace('_', ' ')} ms", ".2f") for p in PHASES],
    ]
    summary = [TARGETS]
    summary += [
        f"{c['num_seqs']} seqs: {c['speedup']:.2f}x less engine time than the baseline (per round: "
        + ", ".join(f"{x:.2f}" for x in c["rounds"])
        + f"), {c['cpu_speedup']:.2f}x less CPU time (per round: "
        + ", ".join(f"{x:.2f}" for x in c["cpu_rounds"])
        + ")"
        for c in comparisons
    ]
    summary += [
        f"overlap, {o['step_time_ms']:g} ms device time per step, {o['num_seqs']} seqs: "
        f"{o['sync_ms_per_step']:.2f} ms/step without, {o['async_ms_per_step']:.2f} ms/step with async "
        f"scheduling ({o['speedup']:.2f}x)"
        for o in overlap
    ]
    this = [r for r in rows if r["engine"] == "this"]
    panels = [
        Panel(
            "engine time per step, by phase",
            "ms per step",
            [str(r["num_seqs"]) for r in this],
            {p.replace("_", " "): [r[f"{p}_ms"] for r in this] for p in PHASES},
            xlabel="running sequences",
        )
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    header = [
        f"workload: N requests, prompts 100-400 tokens, {args.output_tokens} output tokens, greedy, "
        f"ignore EOS; null executor; {args.rounds} round(s), medians"
    ]
    if baseline:
        header.append(f"baseline: {baseline}")
    return Report(
        "host-overhead",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"comparisons": comparisons, "overlap": overlap},
        panels,
        title="Engine time per step (null executor)",
    )


def _overlap(n: int, args: argparse.Namespace) -> dict:
    """Wall time per step with a device of ``--step-time``, async scheduling off and on (alternating)."""
    modes = {False: [], True: []}
    for r in range(args.rounds):
        for mode in modes:
            _progress(
                f"{n} seqs, {args.step_time:g} ms device steps, round {r + 1}/{args.rounds}: async {mode}"
            )
            modes[mode].append(
                measure_in(
                    None,
                    num_seqs=n,
                    output_tokens=args.output_tokens,
                    seed=args.seed + r,
                    step_time=args.step_time / 1e3,
                    async_scheduling=mode,
                )
            )
    off, on = (statistics.median(m["wall_ms_per_step"] for m in modes[k]) for k in (False, True))
    return {
        "num_seqs": n,
        "step_time_ms": args.step_time,
        "sync_ms_per_step": off,
        "async_ms_per_step": on,
        "speedup": off / on,
        "rounds": [(a["wall_ms_per_step"], b["wall_ms_per_step"]) for a, b in zip(modes[False], modes[True])],
    }


def _baseline_core(path: str) -> str:
    root = Path(path).expanduser().resolve()
    for candidate in (root / "core" / "src", root / "core", root):
        if (candidate / "hetero_core" / "__init__.py").is_file():
            return str(candidate)
    raise HeteroError(
        f"--baseline {path}: no hetero_core/ there or in its core/src/ (or core/); pass a checkout of Hetero "
        "(e.g. `git worktree add --detach /tmp/base main`)"
    )


def _median_row(runs: list[dict]) -> dict:
    row = dict(runs[0])
    for key, value in runs[0].items():
        if key not in ("num_seqs", "steps") and value is not None:
            row[key] = statistics.median(r[key] for r in runs)
    return row


def _progress(text: str) -> None:
    print(f"host-overhead: {text}", file=sys.stderr, flush=True)
