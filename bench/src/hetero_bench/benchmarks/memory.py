"""Memory and model size: peak RSS, time to first token and batch-1 decode, Hetero beside vLLM CPU.

Question: what does each engine need to start a checkpoint of a given size and answer, under a
memory limit such as a smaller machine's? For each ``--models`` checkpoint (``random:`` shapes of
360M, 1B, 3B and 8B, by default the two small ones; or any HF directory) and each engine, one after another
(never two engines at once), in a process of its own: Hetero as ``hetero run`` starts it (default
settings, ``HETERO_*`` variables apply; ``hetero_worker.py``) and vLLM CPU from its venv on the same
directory (``peers/vllm_worker.py``: compiled, its default; dtype the checkpoint's). With
``--memory-limit``, each process runs in a cgroup of its own capped at that size (``memory_limit``):
an engine that needs more is OOM-killed, and the table says so.

Recorded (``engine_process``): time to the first token of ``--prompt`` from process start (the
interpreter, imports, load, prefill); steady decode tokens/s at batch 1 (``--decode-tokens`` after a
32-token prompt, the 1-token request's time subtracted); peak RSS (the process group's summed RSS,
sampled, its processes' summed VmHWM, and the largest one process's: a tensor-parallel rank's) and,
when limited, the cgroup's peak charge (RSS and the page cache read). Ratios are Hetero / vLLM:
under 1 is less memory and time, over 1 faster decode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hetero_bench.options import model_path, positive_float, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "peak RSS, time to first token, batch-1 decode per model size, Hetero beside vLLM CPU"
NEEDS = "torch; vLLM's venv for its rows; root for --memory-limit (a cgroup per engine)"
DEFAULT_MODELS = ("random:smollm2-360m", "random:llama-1b")
ENGINES = ("hetero", "vllm")
DECODE_PROMPT = [(7 * i) % 200 + 20 for i in range(32)]
_ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        metavar="MODEL",
        help="HF directories or random:SHAPE[:DTYPE] (random:smollm2-360m, random:llama-1b, "
        f"random:llama-3b, random:llama-8b); default: {' '.join(DEFAULT_MODELS)}",
    )
    parser.add_argument(
        "--engines", nargs="+", choices=ENGINES, default=list(ENGINES), help="default: hetero vllm"
    )
    parser.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="run each engine in a cgroup capped at SIZE (21G, 512M; needs root and cgroups)",
    )
    parser.add_argument("--rounds", type=positive_int, default=1, help="runs of each engine (default: 1)")
    parser.add_argument(
        "--decode-tokens", type=positive_int, default=64, help="batch-1 decode tokens timed (default: 64)"
    )
    parser.add_argument("--prompt", default="The capital of France is", help="the first request's text")
    parser.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        help="both engines' dtype (default: Hetero's own default; vLLM the checkpoint's)",
    )
    parser.add_argument("--executor", metavar="NAME", help="Hetero's executor (default: its settings')")
    parser.add_argument(
        "--vllm-eager", action="store_true", help="vLLM with enforce_eager (no torch.compile)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=1800,
        help="seconds an engine may take per step (default: 1800)",
    )


def epilog() -> str:
    return (
        "the 8B run of issue 36 on a 24 GB machine (round 1 a first start, round 2 a later one):\n"
        "  hetero bench memory --models random:llama-8b --memory-limit 21G --rounds 2 --json memory_8b.json"
    )


def run(args: argparse.Namespace) -> Report:
    from hetero_bench.memory_limit import parse_size

    limit_bytes = None
    if args.memory_limit is not None:
        try:
            limit_bytes = parse_size(args.memory_limit)
        except ValueError as exc:
            raise HeteroError(f"--memory-limit: {exc}") from None
    if not args.prompt.strip():
        raise HeteroError("--prompt is empty; give some text")
    commands = {name: _command(name, args) for name in args.engines}
    unavailable = {name: c for name, c in commands.items() if isinstance(c, str)}
    for name, why in unavailable.items():
        print(f"hetero bench memory: skipping {name}: {why}", file=sys.stderr)
    limit_note = _limit_note(limit_bytes)
    rows = []
    for spec in args.models:
        directory = Path(model_path(spec))
        if not (directory / "config.json").is_file():
            raise HeteroError(f"--models {spec}: {directory} is not an HF directory (no config.json)")
        facts = _checkpoint_facts(directory)
        for number in range(1, args.rounds + 1):
            for name, command in commands.items():
                if name in unavailable:
                    continue
                print(f"{spec}: {name}, round {number}/{args.rounds} ...", file=sys.stderr)
                measured = _measure(name, command(directory, facts["dtype"]), args, limit_bytes, limit_note)
                each = measured.hwm_each_mb or []
                row = {"model": spec, "engine": name, "round": number, **facts, **measured.as_dict()}
                rows.append({**row, "processes": len(each) or None, "hwm_max_mb": max(each, default=None)})
                print(f"{spec}: {name}: {_brief(measured)}", file=sys.stderr)
    return _report(args, rows, limit_bytes, limit_note)


def _command(name: str, args: argparse.Namespace):
    """engine name -> (directory, checkpoint dtype) -> (command, env); a string: why it cannot run."""
    if name == "hetero":
        flags = [f"--{k}={v}" for k, v in (("dtype", args.dtype), ("executor", args.executor)) if v]

        def hetero(directory: Path, dtype: str):
            command = [sys.executable, "-m", "hetero_bench.hetero_worker", "--model", str(directory)]
            return command + flags + ["--first-prompt", args.prompt], dict(os.environ)

        return hetero
    from hetero_bench.peers import PeerUnavailable
    from hetero_bench.peers.vllm_cpu import WORKER, find_vllm_python, worker_env

    try:
        python = find_vllm_python()
    except PeerUnavailable as exc:
        return str(exc)

    def vllm(directory: Path, dtype: str):
        chosen = args.dtype if args.dtype and args.dtype != "auto" else dtype
        command = [str(python), "-u", str(WORKER), "--model", str(directory), "--dtype", chosen]
        command += ["--first-prompt", args.prompt] + (["--eager"] if args.vllm_eager else [])
        return command, worker_env(None)

    return vllm


def _measure(name, command_env, args, limit_bytes, limit_note):
    from hetero_bench.engine_process import measure
    from hetero_bench.memory_limit import LimitUnavailable, open_limit

    command, env = command_env
    limit = None
    if limit_bytes is not None and limit_note is None:
        try:
            limit = open_limit(f"hetero-bench-{os.getpid()}-{name}", limit_bytes)
        except LimitUnavailable as exc:  # the probe worked; this one did not (a leftover, a race)
            print(f"hetero bench memory: no memory limit: {exc}", file=sys.stderr)
    try:
        return measure(command, env, DECODE_PROMPT, args.decode_tokens, args.timeout, limit)
    finally:
        if limit is not None:
            limit.close()


def _limit_note(limit_bytes: int | None) -> str | None:
    """None when a limit can be applied (or none asked); else why not, said once, and run without."""
    if limit_bytes is None:
        return None
    from hetero_bench.memory_limit import LimitUnavailable, open_limit

    try:
        open_limit(f"hetero-bench-{os.getpid()}-probe", limit_bytes).close()
    except LimitUnavailable as exc:
        print(f"hetero bench memory: running without a memory limit: {exc}", file=sys.stderr)
        return str(exc)
    return None


def _checkpoint_facts(directory: Path) -> dict:
    config = json.loads((directory / "config.json").read_text())
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    return {
        "dtype": dtype,
        "checkpoint_gb": size / 1e9,
        "parameters_b": size / _ELEMENT_BYTES.get(dtype, 2) / 1e9,
    }


def _brief(m) -> str:
    if m.error:
        return m.error
    return (
        f"first token {m.first_token_s:.1f} s, decode {m.decode_tokens_per_s:.1f} tok/s, "
        f"peak RSS {m.peak_rss_mb:,.0f} MiB"
    )


def _ratios(ours: dict | None, theirs: dict | None) -> dict[str, float | None]:
    """Hetero / vLLM of each figure, where both engines have it (a failed run has none)."""
    pair = {}
    for key in ("peak_rss_mb", "first_token_s", "decode_tokens_per_s"):
        a = ours.get(key) if ours and not ours["error"] else None
        b = theirs.get(key) if theirs and not theirs["error"] else None
        pair[key] = a / b if a is not None and b else None
    return pair


def _report(args, rows: list[dict], limit_bytes: int | None, limit_note: str | None) -> Report:
    """Ratios per round: round 1 is a checkpoint's first start here (Hetero prepares its weights file
    and, with dtype auto, times its candidates; vLLM fills its compile cache), later rounds reuse those."""
    summary, ratios = [], {}
    for spec in args.models:
        ratios[spec] = []
        for number in range(1, args.rounds + 1):
            found = {r["engine"]: r for r in rows if r["model"] == spec and r["round"] == number}
            for r in found.values():
                if r["error"]:
                    summary.append(f"{spec}: {r['engine']} round {number} failed: {r['error']}")
            pair = _ratios(found.get("hetero"), found.get("vllm"))
            ratios[spec].append({"round": number, **pair})
            if any(v is not None for v in pair.values()):
                summary.append(
                    f"{spec}, round {number}: Hetero / vLLM: peak RSS {_x(pair['peak_rss_mb'])}, "
                    f"time to first token {_x(pair['first_token_s'])}, "
                    f"batch-1 decode {_x(pair['decode_tokens_per_s'])}"
                )
    columns = [
        Column("model", "model"),
        Column("engine", "engine"),
        Column("round", "round"),
        Column("parameters_b", "params B", ".2f"),
        Column("checkpoint_gb", "ckpt GB", ".1f"),
        Column("first_token_s", "first token s", ".1f"),
        Column("decode_tokens_per_s", "decode tok/s", ".1f"),
        Column("peak_rss_mb", "peak RSS MiB", ",.0f"),
        Column("hwm_sum_mb", "sum VmHWM MiB", ",.0f"),
        Column("processes", "procs"),
        Column("hwm_max_mb", "max VmHWM MiB", ",.0f"),
        Column("cgroup_peak_mb", "cgroup peak MiB", ",.0f"),
        Column("oom_killed", "OOM"),
    ]
    limit = "none" if limit_bytes is None else f"{limit_bytes / (1 << 30):.1f} GiB per engine (a cgroup)"
    if limit_note:
        limit = f"none ({limit_note})"
    header = [
        f"{len(args.models)} models, engines {', '.join(args.engines)}, {args.rounds} round(s), one process "
        f"at a time; first token of {args.prompt!r} from process start; batch-1 decode of "
        f"{args.decode_tokens} tokens after {len(DECODE_PROMPT)}; memory limit: {limit}"
    ]
    labels = [f"{r['model'].removeprefix('random:')} {r['engine']}" for r in rows]
    panels = [
        Panel("peak RSS", "MiB", labels, {"sampled": [r["peak_rss_mb"] for r in rows]}),
        Panel("time to first token", "seconds", labels, {"from start": [r["first_token_s"] for r in rows]}),
        Panel("batch-1 decode", "tokens/s", labels, {"decode": [r["decode_tokens_per_s"] for r in rows]}),
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot", "handler")}
    settings["memory_limit_bytes"], settings["memory_limit_unavailable"] = limit_bytes, limit_note
    return Report(
        "memory",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"ratios_hetero_over_vllm": ratios},
        panels,
        title="Memory and model size",
    )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
