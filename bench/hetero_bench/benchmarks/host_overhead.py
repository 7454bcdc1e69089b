"""The engine's own time per step (host overhead), on the ``null`` executor, which does no work.

Workload (issue 25): N requests of 100-400 random prompt tokens and 128 output tokens each (greedy,
EOS ignored), queued at once with room for all of them to run together (``max_batch_size`` =
``max_num_seqs`` = N, 32 KV blocks and 256 tokens of step budget per request, no prefix cache),
added as ``generate`` adds them (final outputs only) and stepped to the end. Per N: the engine's time
per step (every step's wall time less the executor's), per running sequence per step, the ceiling
it puts on throughput (output tokens per second of engine time: what a device with free steps would
reach), and the split by phase (``engine.timings``: schedule, build batch, postprocess, outputs).

``--step-time`` models a GPU: the executor sleeps that long per step, and the wall time per step is
compared with async scheduling off and on (the next step scheduled while the device runs). Rounds
alternate the modes; medians are reported. On an engine without phase timings (an older checkout)
the phases print as "-" and the engine time is measured around the executor.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hetero_bench.options import non_negative_float, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "the engine's own time per step at 32-1024 sequences (null executor), and overlap with a device"
NEEDS = "hetero-plugins-mock"
PHASES = ("schedule", "build_batch", "postprocess", "outputs")
TARGETS = "targets (2-core machine): <= 2.5 ms per step at 256 sequences (>= 100k tok/s), <= 10 µs/seq/step at 1024"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-seqs", type=positive_int, nargs="+", default=[32, 256, 1024], metavar="N",
                        help="running sequences to measure (default: 32 256 1024)")
    parser.add_argument("--output-tokens", type=positive_int, default=128, help="per request (default: 128)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="runs per setting; medians (default: 3)")
    parser.add_argument("--step-time", type=non_negative_float, default=2.0, metavar="MS",
                        help="simulated device milliseconds per step for the overlap rows (0: none; default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="the prompts' random seed (default: 0)")


def measure(num_seqs: int, output_tokens: int, seed: int, step_time: float = 0.0,
            async_scheduling: bool | None = None) -> dict:
    """One run to the end; the engine's time and the phases, summed over the steps."""
    from hetero_core import LLM, SamplingParams

    settings = dict(max_batch_size=num_seqs, max_num_seqs=num_seqs, max_num_blocks=32 * num_seqs,
                    max_total_tokens=256 * num_seqs, enable_prefix_caching=False)
    if async_scheduling is not None:
        settings["async_scheduling"] = async_scheduling
    llm = LLM(executor={"name": "null", "null": {"step_time": step_time}}, **settings)
    engine = llm.engine
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    for _ in range(num_seqs):
        prompt = [rng.randint(32, 126) for _ in range(rng.randint(100, 400))]
        try:
            engine.add_request(prompt, params, stream=False)
        except TypeError:  # an engine without stream= returns every output every step
            engine.add_request(prompt, params)
    timed = _TimedExecutor(engine.executor)
    engine.executor = timed
    before = _phases(engine)
    wall = seq_steps = num_steps = 0.0
    try:
        while engine.has_unfinished_requests():
            started = time.perf_counter()
            engine.step()
            elapsed = time.perf_counter() - started
            stats = engine.stats()
            wall += elapsed
            if stats.last_step_num_seqs:
                num_steps += 1
                seq_steps += stats.last_step_num_seqs
    finally:
        llm.shutdown()
    phases = _phases(engine)
    waited = phases.get("execute", timed.seconds) - before.get("execute", 0.0)
    engine_s = wall - waited
    row = {"num_seqs": num_seqs, "steps": int(num_steps), "wall_ms_per_step": wall / num_steps * 1e3,
           "engine_ms_per_step": engine_s / num_steps * 1e3, "us_per_seq_step": engine_s / seq_steps * 1e6,
           "ceiling_tok_s": num_seqs * output_tokens / engine_s}
    for phase in PHASES:
        row[f"{phase}_ms"] = (phases[phase] - before[phase]) / num_steps * 1e3 if phase in phases else None
    return row


def run(args: argparse.Namespace) -> Report:
    rows, overlap = [], []
    for n in args.num_seqs:
        runs = [measure(n, args.output_tokens, args.seed + r) for r in range(args.rounds)]
        rows.append(_median_row(runs))
        if args.step_time:
            modes = {False: [], True: []}
            for r in range(args.rounds):  # alternating: off, on, off, on, ...
                for mode in modes:
                    modes[mode].append(measure(n, args.output_tokens, args.seed + r, args.step_time / 1e3, mode))
            off, on = _median_row(modes[False]), _median_row(modes[True])
            overlap.append({"num_seqs": n, "step_time_ms": args.step_time, "sync_ms_per_step": off["wall_ms_per_step"],
                            "async_ms_per_step": on["wall_ms_per_step"],
                            "speedup": off["wall_ms_per_step"] / on["wall_ms_per_step"],
                            "rounds": [(a["wall_ms_per_step"], b["wall_ms_per_step"])
                                       for a, b in zip(modes[False], modes[True])]})
    columns = [Column("num_seqs", "seqs"), Column("steps", "steps"),
               Column("engine_ms_per_step", "engine ms/step", ".2f"),
               Column("us_per_seq_step", "µs/seq/step", ".2f"), Column("ceiling_tok_s", "ceiling tok/s", ",.0f"),
               *[Column(f"{p}_ms", f"{p.replace('_', ' ')} ms", ".2f") for p in PHASES]]
    summary = [TARGETS]
    summary += [f"overlap, {o['step_time_ms']:g} ms device time per step, {o['num_seqs']} seqs: "
                f"{o['sync_ms_per_step']:.2f} ms/step without, {o['async_ms_per_step']:.2f} ms/step with async "
                f"scheduling ({o['speedup']:.2f}x)" for o in overlap]
    labels = [str(n) for n in args.num_seqs]
    panels = [Panel("engine time per step, by phase", "ms per step", labels,
                    {p.replace("_", " "): [r[f"{p}_ms"] for r in rows] for p in PHASES}, xlabel="running sequences")]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    header = [f"workload: N requests, prompts 100-400 tokens, {args.output_tokens} output tokens, greedy, "
              f"ignore EOS; null executor; {args.rounds} round(s), medians"]
    return Report("host-overhead", settings, Table(columns, rows), header, summary, {"overlap": overlap}, panels,
                  title="Engine time per step (null executor)")


def _median_row(runs: list[dict]) -> dict:
    row = dict(runs[0])
    for key, value in runs[0].items():
        if key not in ("num_seqs", "steps") and value is not None:
            row[key] = statistics.median(r[key] for r in runs)
    return row


def _phases(engine) -> dict[str, float]:
    timings = getattr(engine, "timings", None)
    if timings is None:
        return {}
    return {p: getattr(timings, f"{p}_s") for p in (*PHASES, "execute")}


class _TimedExecutor:
    """The executor, with the seconds spent in ``execute`` counted (for engines without timings)."""

    def __init__(self, inner) -> None:
        self.inner, self.seconds = inner, 0.0

    def execute(self, batch):
        started = time.perf_counter()
        try:
            return self.inner.execute(batch)
        finally:
            self.seconds += time.perf_counter() - started

    def __getattr__(self, name):
        return getattr(self.inner, name)
