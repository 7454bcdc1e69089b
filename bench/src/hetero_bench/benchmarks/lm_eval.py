"""lm-eval against `hetero serve`: the same tasks scored through the server and by Hugging Face.

Starts ``hetero serve`` on the model (default: the embedded SmolLM2, in float32) on a free loopback
port, and runs EleutherAI's lm-evaluation-harness (``lm_eval``, installed in its own environment) with
its ``local-completions`` model against it, then with its ``hf`` model (transformers) on the same HF
directory and dtype, both with ``--log_samples``. The tasks ship with hetero-bench
(``data/lm_eval``): ``hetero_mc``, 48 four-way multiple-choice questions scored by loglikelihood
(lm-eval sends ``echo`` with ``logprobs``), and ``hetero_qa``, 20 short answers generated greedily
(``generate_until``, exact match). Prints both accuracies side by side, the largest per-item
loglikelihood difference and how many generated answers differ. Flags after ``--`` go to
``hetero serve``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hetero_bench.lm_eval_run import TASKS, copy_tasks, find_lm_eval, lm_eval_version, read_run, run_lm_eval
from hetero_bench.options import add_engine_arguments, engine_settings, model_path, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "lm-eval's local-completions against `hetero serve` vs its hf model: accuracies, per-item loglik"
NEEDS = "lm-eval in its own environment (--lm-eval PATH: lm-eval[api,hf]), torch, the model"
TOLERANCE = 1e-3  # |loglikelihood difference| expected in float32, summed over a continuation's tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lm-eval",
        metavar="PATH",
        help="the lm_eval program (default: $HETERO_BENCH_LM_EVAL, else lm_eval on PATH)",
    )
    parser.add_argument(
        "--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="tasks to run (default: both)"
    )
    parser.add_argument("--limit", type=positive_int, help="only the first N items of each task")
    parser.add_argument(
        "--num-concurrent",
        type=positive_int,
        default=1,
        help="requests local-completions keeps in flight (default: 1)",
    )
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        help="keep lm_eval's results, samples and logs here (default: a temporary folder, removed)",
    )
    add_engine_arguments(parser)
    parser.add_argument(
        "serve_flags", nargs="*", metavar="-- SERVE FLAGS", help="more flags for hetero serve"
    )


def run(args: argparse.Namespace) -> Report:
    import httpx

    from hetero_bench.benchmarks.serving import start_server, stop_server

    lm_eval = find_lm_eval(args.lm_eval)
    dtype = args.dtype or "float32"
    model_dir = hf_model_dir(args)
    base = Path(args.output_dir) if args.output_dir else Path(tempfile.mkdtemp(prefix="hetero-lm-eval-"))
    try:
        work = copy_tasks(base / "tasks")
        serve_flags = ["--model", str(model_dir), "--executor", args.executor, "--dtype", dtype]
        serve_flags += ["--config", args.config] if args.config else []
        process, base_url = start_server(serve_flags + list(args.serve_flags))
        try:
            served = httpx.get(base_url + "/v1/models").json()["data"][0]
            model_args = (
                f"model={served['id']},base_url={base_url}/v1/completions,tokenizer_backend=huggingface,"
                f"tokenizer={model_dir},num_concurrent={args.num_concurrent},max_retries=1,"
                f"max_length={served['max_model_len']}"
            )
            hetero_s = _timed(lm_eval, "local-completions", model_args, args, work, base / "hetero")
        finally:
            stop_server(process)
        hf_args = f"pretrained={model_dir},dtype={dtype}"
        hf_s = _timed(lm_eval, "hf", hf_args, args, work, base / "hf")
        runs = {task: (read_run(base / "hetero", task), read_run(base / "hf", task)) for task in args.tasks}
    finally:
        if not args.output_dir:
            shutil.rmtree(base, ignore_errors=True)
    versions = lm_eval_version(lm_eval)
    return build_report(args, runs, model_dir, dtype, versions, {"hetero": hetero_s, "hf": hf_s}, model_args)


def hf_model_dir(args: argparse.Namespace) -> Path:
    """The HF directory both sides load: the embedded model's (converted once), or ``--model``'s."""
    if not args.model:
        from hetero_core.model.embedded import ensure_embedded_model

        return ensure_embedded_model(engine_settings(args).cache_dir)
    path = Path(model_path(args.model)).expanduser()
    if not (path / "config.json").is_file():
        raise HeteroError(
            f"--model {args.model}: lm-eval's hf model needs an HF model directory (with config.json); "
            "for a .gguf file give the directory hetero converted it into"
        )
    return path.resolve()


def _timed(lm_eval: str, model: str, model_args: str, args, work: Path, out: Path) -> float:
    start = time.perf_counter()
    print(f"lm_eval --model {model} ... (its output: {out / 'lm_eval.log'})", file=sys.stderr)
    run_lm_eval(lm_eval, model, model_args, args.tasks, work, out, args.limit)
    return time.perf_counter() - start


def compare(hetero, hf) -> dict:
    """Per task: the largest |loglikelihood difference|, and the doc ids whose answers differ."""
    if set(hetero.loglikelihoods) != set(hf.loglikelihoods) or set(hetero.generations) != set(hf.generations):
        raise HeteroError("the two lm_eval runs scored different items (their samples files differ)")
    deltas = [
        abs(a - b)
        for doc, choices in hetero.loglikelihoods.items()
        for a, b in zip(choices, hf.loglikelihoods[doc], strict=True)
    ]
    differ = sorted(doc for doc, text in hetero.generations.items() if text != hf.generations[doc])
    picks = sorted(
        doc
        for doc, choices in hetero.loglikelihoods.items()
        if choices.index(max(choices)) != hf.loglikelihoods[doc].index(max(hf.loglikelihoods[doc]))
    )
    return {
        "num_choices": len(deltas),
        "max_abs_loglik_delta": max(deltas) if deltas else None,
        "different_picks": picks,
        "different_generations": differ,
    }


def build_report(
    args, runs: dict, model_dir: Path, dtype: str, versions: str, seconds: dict, model_args
) -> Report:
    rows, comparisons = [], {}
    for task, (hetero, hf) in runs.items():
        comparisons[task] = compare(hetero, hf)
        for metric, value in hetero.metrics.items():
            other = hf.metrics.get(metric)
            rows.append(
                {"task": task, "metric": metric, "hetero": value, "hf": other, "equal": value == other}
            )
    columns = [
        Column("task", "task"),
        Column("metric", "metric"),
        Column("hetero", "hetero serve", ".4f"),
        Column("hf", "lm-eval hf", ".4f"),
        Column("equal", "equal"),
    ]
    summary = []
    for task, c in comparisons.items():
        n = len(runs[task][0].loglikelihoods) + len(runs[task][0].generations)
        if c["max_abs_loglik_delta"] is not None:
            ok = "within" if c["max_abs_loglik_delta"] <= TOLERANCE else "OVER"
            summary.append(
                f"{task}: max |delta loglikelihood| {c['max_abs_loglik_delta']:.2e} over {c['num_choices']} "
                f"choices of {n} items ({ok} {TOLERANCE:g}); items picked differently: "
                f"{len(c['different_picks'])}"
            )
        if runs[task][0].generations:
            summary.append(f"{task}: generated answers that differ: {len(c['different_generations'])} of {n}")
    summary.append(f"lm_eval wall time: hetero serve {seconds['hetero']:.0f} s, hf {seconds['hf']:.0f} s")
    header = [
        f"model {model_dir} in {dtype}; {versions}",
        f"local-completions model_args: {model_args}",
    ]
    settings = {**{k: v for k, v in vars(args).items() if k not in ("json", "plot")}, "dtype": dtype}
    panels = [
        Panel(
            "accuracy",
            "score",
            [f"{r['task']} {r['metric']}" for r in rows],
            {"hetero serve": [r["hetero"] for r in rows], "lm-eval hf": [r["hf"] for r in rows]},
        )
    ]
    results = {
        "comparisons": comparisons,
        "versions": versions,
        "seconds": seconds,
        "model_dir": str(model_dir),
    }
    return Report(
        "lm-eval", settings, Table(columns, rows), header, summary, results, panels,
        title="lm-eval: hetero serve (local-completions) vs transformers (hf)",
    )  # fmt: skip
