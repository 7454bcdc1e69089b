"""Structured output: what a grammar's token mask costs per token, against the sampler without one.

For each batch size, ``--tokens`` steps of a constrained walk (the ``nested objects`` schema of the
structured-output kit, on the chosen tokenizer's vocabulary): each step times, in alternating order,
the sampler on random logits without a mask (the peer) and with one (every row's grammar state fills
its bitmask row, then the sampler applies the batch's mask), then advances each state by its masked
token (a finished walk starts again). Reported: medians per step (the fill, and the mask's
application alone, timed apart), per row, and the ratio to the sampler alone. With one thread (the
default) the times are the thread's CPU time, so a busy shared machine does not inflate them.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hetero_bench.options import positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "per-token cost of a structured-output mask (xgrammar) against the sampler without one"
NEEDS = "torch and xgrammar (pip install 'hetero-core[structured]'); --tokenizer smollm2 needs the model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", choices=["byte", "smollm2"], default="smollm2",
                        help="vocabulary to mask: the byte tokenizer's 258 ids or SmolLM2's 49,152 (default)")
    parser.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 8, 32], help="rows per step")
    parser.add_argument("--tokens", type=positive_int, default=200, help="timed steps per batch size")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch intra-op threads (default 1: steady figures on a shared machine)")


def _tokenizer(name: str):
    if name == "byte":
        from hetero_core.default_plugins.byte_tokenizer import ByteTokenizer

        return ByteTokenizer()
    from hetero_core.default_plugins.hf_tokenizer import HFTokenizer
    from hetero_core.model.embedded import ensure_embedded_model

    return HFTokenizer(ensure_embedded_model())


def run(args: argparse.Namespace) -> Report:
    import importlib.util

    if importlib.util.find_spec("xgrammar") is None or importlib.util.find_spec("torch") is None:
        raise HeteroError("the structured-output benchmark needs torch and xgrammar: pip install 'hetero-core[structured]'")
    import torch

    from hetero_core.default_plugins.xgrammar_backend import XGrammarBackend
    from hetero_core.default_plugins.xgrammar_options import XGrammarOptions
    from hetero_core.engine.sampler import Sampler, SamplingRow
    from hetero_core.engine.structured_output import StructuredOutput, StructuredOutputContext
    from hetero_core.engine.token_bitmask import apply_token_bitmask
    from hetero_core.engine.params import SamplingParams
    from hetero_core.structured_output import GuidedDecodingParams
    from hetero_core.testing.structured_output_cases import SCHEMAS

    torch.set_num_threads(args.threads)
    # One thread: the CPU time of this thread is the work itself, whatever else the machine runs.
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    tokenizer = _tokenizer(args.tokenizer)
    vocab = tokenizer.vocab_size
    ctx = StructuredOutputContext(None, XGrammarOptions(), tokenizer, vocab)
    so = StructuredOutput(lambda: XGrammarBackend(ctx), vocab)
    compiled = so.compile(GuidedDecodingParams(json=SCHEMAS["nested objects"]))
    generator = torch.Generator().manual_seed(0)
    rows_out = []
    for batch in args.batch_sizes:
        states = [so.new_state(compiled) for _ in range(batch)]
        rows = [SamplingRow(SamplingParams(temperature=0.7, seed=i), [1], []) for i in range(batch)]
        plain, masked, fills, applies = [], [], [], []
        sampler = Sampler(seed=0)
        for step in range(args.tokens):
            logits = torch.randn(batch, vocab, generator=generator)
            order = ("plain", "masked") if step % 2 == 0 else ("masked", "plain")
            for which in order:
                start = clock()
                if which == "plain":
                    sampler.sample(logits, rows)
                    plain.append(clock() - start)
                    continue
                bitmask = so.bitmask(states)
                filled = clock()
                out = sampler.sample(logits, rows, token_bitmask=bitmask)
                masked.append(clock() - start)
                fills.append(filled - start)
                scores = logits.clone()
                start = clock()
                apply_token_bitmask(scores, bitmask)
                applies.append(clock() - start)
            for i, token in enumerate(out.token_ids):
                if not states[i].accept_token(token) or states[i].is_terminated():
                    states[i] = so.new_state(compiled)
        p, m, f, a = (statistics.median(x) * 1e6 for x in (plain, masked, fills, applies))
        rows_out.append({"batch": batch, "plain_us": p, "masked_us": m, "fill_us": f, "apply_us": a,
                         "mask_us_per_row": (m - p) / batch, "ratio": m / p})
    table = Table([Column("batch", "batch"), Column("plain_us", "sampler µs", ".0f"),
                   Column("masked_us", "fill+masked sampler µs", ".0f"), Column("fill_us", "fill µs", ".0f"),
                   Column("apply_us", "apply µs", ".0f"),
                   Column("mask_us_per_row", "mask µs/row", ".1f"), Column("ratio", "ratio", ".2f", "x")], rows_out)
    summary = [f"batch {r['batch']}: the mask adds {r['mask_us_per_row']:.1f} µs per row per token "
               f"({r['ratio']:.2f}x the sampler alone)" for r in rows_out]
    panels = [Panel("one sampling step", "µs", [str(r["batch"]) for r in rows_out],
                    {"sampler": [r["plain_us"] for r in rows_out], "fill + masked sampler": [r["masked_us"] for r in rows_out]},
                    xlabel="batch size")]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    header = [f"vocabulary {vocab} ({args.tokenizer}), schema 'nested objects', {args.tokens} steps per batch size, "
              f"alternating plain / masked, {args.threads} torch thread(s), temperature 0.7, "
              + ("CPU time of the thread" if args.threads == 1 else "wall time")]
    return Report("structured-output", settings, table, header, summary, {}, panels,
                  title="Structured output: mask cost per token")
