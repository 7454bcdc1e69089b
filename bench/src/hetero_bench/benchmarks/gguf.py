"""One GGUF file, Hetero beside llama.cpp: batch-1 decode tok/s (a 72-token prompt, 128 output
tokens, the decode steps timed), 32-parallel output tok/s (32 requests of 72 prompt tokens and 41
output tokens, the prefill counted) and, with ``--perplexity``, perplexity by llama.cpp's method
(``chunked_perplexity.py``: ``-c 512`` chunks, the second half of each scored) on the same text.
llama.cpp is the peer when its tools (``llama-bench``, ``llama-batched-bench``, ``llama-perplexity``)
are in ``--llama-cpp DIR`` or on PATH, run with the same shapes and threads on the same file; without
them Hetero's figures alone, and one line that says why. Hetero loads the GGUF as it loads any (its
weights dequantized where it has no kernel for the type, so its memory and speed are those of that).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Report, Table

SUMMARY = "a GGUF file beside llama.cpp: batch-1 and 32-parallel tok/s, perplexity by llama.cpp's method"
NEEDS = "torch and a .gguf file; llama.cpp's tools (--llama-cpp DIR or PATH) for the peer"
SHIPPED = "shipped"  # --perplexity's name for the shipped text (quality.py's and spec-decode's, joined)
# --perplexity's name for a longer shipped text: the GNU GPL v3 (verbatim, as its licence allows), about
# 8,000 SmolLM2 tokens (14 chunks of 512: a figure steadier than the shipped text's 2 chunks)
GPL3 = "gpl-3"
GPL3_FILE = "gpl-3.0.txt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=positive_int, default=2, help="CPU threads of both engines (2)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=72, help="prompt length (72)")
    parser.add_argument("--output-tokens", type=positive_int, default=128, help="batch-1 decode tokens (128)")
    parser.add_argument("--parallel", type=positive_int, default=32, help="parallel requests (32)")
    parser.add_argument(
        "--parallel-output-tokens",
        type=positive_int,
        default=41,
        help="output tokens a parallel request (41)",
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="repetitions, median taken (3)")
    parser.add_argument(
        "--speed", action=argparse.BooleanOptionalAction, default=True, help="measure tok/s (default: on)"
    )
    parser.add_argument(
        "--perplexity",
        metavar="TEXT",
        help=f"also perplexity on TEXT (a file; {SHIPPED!r}: the text shipped in hetero_bench/data, "
        f"2 chunks; {GPL3!r}: the GNU GPL v3's text shipped there, 14 chunks)",
    )
    parser.add_argument("--ctx", type=positive_int, default=512, help="perplexity chunk tokens (512)")
    parser.add_argument(
        "--llama-cpp",
        metavar="DIR",
        help="llama.cpp's build folder (its tools in DIR or DIR/bin); default: PATH; 'none': no peer",
    )
    parser.add_argument(
        "--code-activations",
        choices=("float", "int8"),
        help="the torch executor's code_activations: block-code linears on fp32 or int8 activations "
        "(default: the executor's, float)",
    )
    parser.add_argument(
        "--amx-linears",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the torch executor's amx_linears: AMX tiles where the CPU has them (bf16 linears, and "
        "int8 code sums with --code-activations int8); --no-amx-linears: never (default: the executor's, on)",
    )
    add_engine_arguments(parser)


def executor_options(args: argparse.Namespace) -> dict | None:
    """The torch executor's options from the flags (None for another executor, which takes none here)."""
    from hetero_core import HeteroError

    asked = {"code_activations": args.code_activations, "amx_linears": args.amx_linears}
    asked = {name: value for name, value in asked.items() if value is not None}
    if args.executor != "torch":
        if asked:
            flags = ", ".join("--" + name.replace("_", "-") for name in asked)
            raise HeteroError(f"{flags}: the torch executor's options; drop them or use --executor torch")
        return None
    return {"num_threads": args.threads, **asked}


def run(args: argparse.Namespace) -> Report:
    from hetero_core import HeteroError

    gguf_path = _gguf_path(args.model)
    if not args.speed and not args.perplexity:
        raise HeteroError("--no-speed without --perplexity measures nothing; give --perplexity TEXT")
    text_path, text = _text(args.perplexity) if args.perplexity else (None, None)
    try:
        return _measure(args, gguf_path, text_path, text)
    finally:
        if args.perplexity == SHIPPED:
            Path(text_path).unlink(missing_ok=True)  # the shipped text's copy for llama-perplexity


def _measure(args, gguf_path: Path, text_path: str | None, text: str | None) -> Report:
    from hetero_bench.peers import PeerUnavailable
    from hetero_bench.peers.hetero_engine import HeteroPeer
    from hetero_bench.peers.llama_cpp import LlamaCpp
    from hetero_core import HeteroError

    peer, skipped = None, None
    if args.llama_cpp != "none":
        try:
            peer = LlamaCpp(str(gguf_path), args.llama_cpp, args.threads)
        except PeerUnavailable as exc:
            skipped = str(exc)
            print(f"hetero bench: skipping llama.cpp: {exc}", file=sys.stderr)
    args.model = str(gguf_path)
    options = executor_options(args)
    hetero = HeteroPeer(engine_settings(args, options, enable_prefix_caching=False))
    rows = {"hetero": {"engine": "hetero", "version": _hetero_version()}}
    try:
        refusal = getattr(getattr(hetero.engine, "processor", None), "prompt_logprobs_refusal", None)
        if text is not None and refusal is not None:
            raise HeteroError(f"--perplexity: {refusal}")
        if args.speed:
            rows["hetero"].update(_hetero_speed(hetero, args))
        if text is not None:
            rows["hetero"].update(_hetero_perplexity(hetero, gguf_path, text, args.ctx))
    finally:
        hetero.close()
    if peer is not None:
        try:
            rows["llama.cpp"] = {
                "engine": "llama.cpp",
                "version": peer.version,
                **_peer_figures(peer, args, text_path),
            }
        except PeerUnavailable as exc:
            skipped = str(exc)
            print(f"hetero bench: llama.cpp failed: {exc}", file=sys.stderr)
    return _report(args, gguf_path, rows, skipped)


def _gguf_path(model: str | None) -> Path:
    from hetero_core import HeteroError
    from hetero_core.model.embedded import find_embedded_gguf

    if model is None:
        return find_embedded_gguf()
    path = Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise HeteroError(f"--model {model}: expected an existing .gguf file (llama.cpp runs the same file)")
    return path


def _text(name: str) -> tuple[str, str]:
    """The perplexity text's path (llama-perplexity reads a file) and its contents."""
    from hetero_bench.quality import DATA, quality_text
    from hetero_core import HeteroError

    if name == SHIPPED:
        text = quality_text() + "\n\n" + (DATA / "spec_decode_text.txt").read_text(encoding="utf-8")
        handle = tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="hetero-ppl-", delete=False)
        with handle:
            handle.write(text)
        return handle.name, text
    path = DATA / GPL3_FILE if name == GPL3 else Path(name).expanduser()
    if not path.is_file():
        raise HeteroError(
            f"--perplexity {name}: no such file "
            f"(or {SHIPPED!r} or {GPL3!r} for a text shipped with hetero-bench)"
        )
    return str(path), path.read_text(encoding="utf-8")


def _prompts(count: int, length: int, vocab_size: int) -> list[list[int]]:
    """Seeded random token ids from 100 up (past SmolLM2's special tokens), as llama.cpp's benches
    feed random tokens."""
    rng = random.Random(37)
    return [
        [rng.randint(min(100, vocab_size - 1), vocab_size - 1) for _ in range(length)] for _ in range(count)
    ]


def _hetero_speed(hetero, args) -> dict:
    from hetero_bench.workload import Request

    [prompt] = _prompts(1, args.prompt_tokens, hetero.vocab_size)
    decode = [1 / hetero.decode_latency(prompt, args.output_tokens) for _ in range(args.rounds)]
    prompts = _prompts(args.parallel, args.prompt_tokens, hetero.vocab_size)
    requests = [Request(p, args.parallel_output_tokens) for p in prompts]
    parallel = [hetero.run(requests).tokens_per_s for _ in range(args.rounds)]
    return {
        "tok_s_1": statistics.median(decode),
        "tok_s_parallel": statistics.median(parallel),
        "rounds": {"decode": decode, "parallel": parallel},
    }


def _hetero_perplexity(hetero, gguf_path: Path, text: str, n_ctx: int) -> dict:
    from hetero_bench.chunked_perplexity import chunked_perplexity, perplexity_chunks

    bos_id = _added_bos(gguf_path)
    ids = hetero.llm.get_tokenizer().encode(text)
    chunks = perplexity_chunks(ids, n_ctx, bos_id)
    return {**chunked_perplexity(hetero.llm, chunks), "text_tokens": chunks.num_text_tokens}


def _added_bos(gguf_path: Path) -> int | None:
    """The BOS llama.cpp's tokenizer adds for this file (None: none): ``tokenizer.ggml.add_bos_token``,
    else its default for the vocabulary's kind (SentencePiece 'llama': yes; BPE 'gpt2': no)."""
    import gguf

    fields = gguf.GGUFReader(str(gguf_path)).fields

    def value(key: str):
        return fields[key].contents() if key in fields else None

    add = value("tokenizer.ggml.add_bos_token")
    if add is None:
        add = value("tokenizer.ggml.model") == "llama"
    bos = value("tokenizer.ggml.bos_token_id")
    return int(bos) if add and bos is not None else None


def _peer_figures(peer, args, text_path: str | None) -> dict:
    figures = {}
    if args.speed:
        decode = peer.decode_tokens_per_s(args.prompt_tokens, args.output_tokens, args.rounds)
        parallel = [
            peer.parallel_tokens_per_s(args.parallel, args.prompt_tokens, args.parallel_output_tokens)
            for _ in range(args.rounds)
        ]
        figures.update(
            tok_s_1=decode["tok_s"],
            tok_s_parallel=statistics.median(p["tok_s"] for p in parallel),
            rounds={"decode": decode["samples"], "parallel": [p["tok_s"] for p in parallel]},
        )
    if text_path is not None:
        figures.update(peer.perplexity(text_path, args.ctx))
    return figures


def _hetero_version() -> str:
    from hetero_core import __version__

    return f"hetero {__version__}"


def _report(args, gguf_path: Path, rows: dict, skipped: str | None) -> Report:
    columns = [Column("engine", "engine")]
    if args.speed:
        columns += [
            Column("tok_s_1", "tok/s b1", ".1f"),
            Column("tok_s_parallel", f"out tok/s x{args.parallel}", ".1f"),
        ]
    if args.perplexity:
        columns += [
            Column("perplexity", "perplexity", ".4f"),
            Column("perplexity_error", "+/-", ".4f"),
            Column("chunks", "chunks", "d"),
        ]
    header = [
        f"model: {gguf_path} ({gguf_path.stat().st_size / 2**20:.1f} MiB); threads: {args.threads}",
    ]
    if args.speed:
        header.append(
            f"speed: batch 1: {args.prompt_tokens}-token prompt, {args.output_tokens} decode tokens timed; "
            f"parallel: {args.parallel} x ({args.prompt_tokens} prompt + {args.parallel_output_tokens} "
            f"output), prefill counted; median of {args.rounds}"
        )
    if args.perplexity:
        header.append(f"perplexity: {args.perplexity}, llama.cpp's method, {args.ctx}-token chunks")
    asked = {name: getattr(args, name) for name in ("code_activations", "amx_linears")}
    if any(value is not None for value in asked.values()):
        header.append("torch executor: " + ", ".join(f"{k} = {v}" for k, v in asked.items() if v is not None))
    summary = [f"{name}: {row['version']}" for name, row in rows.items()]
    if skipped:
        summary.append(f"llama.cpp not run: {skipped}")
    if "llama.cpp" in rows:
        ours, theirs = rows["hetero"], rows["llama.cpp"]
        for key, what in (
            ("tok_s_1", "batch-1 tok/s"),
            ("tok_s_parallel", f"{args.parallel}-parallel tok/s"),
        ):
            if key in ours and key in theirs:
                summary.append(f"hetero / llama.cpp {what}: {ours[key] / theirs[key]:.2f}x")
        if "perplexity" in ours and "perplexity" in theirs:
            diff = ours["perplexity"] / theirs["perplexity"] - 1
            verdict = "within" if abs(diff) <= 0.01 else "NOT within"
            summary.append(f"perplexity: hetero {diff:+.2%} from llama.cpp's ({verdict} 1%)")
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    table_rows = [{k: v for k, v in row.items() if k not in ("rounds", "version")} for row in rows.values()]
    extra = {name: {"version": row["version"], "rounds": row.get("rounds")} for name, row in rows.items()}
    return Report("gguf", settings, Table(columns, table_rows), header, summary, {"engines": extra}, [],
                  title="GGUF beside llama.cpp")  # fmt: skip
