"""Offline throughput: Hetero's engine vs HF transformers `generate`, same model, same requests.

Workload (fixed): 32 requests, seed 0, prompts of random token ids with lengths uniform in
[16, 128], output lengths uniform in [16, 64], greedy, ignore EOS. Prints engine tokens/s, HF
sequential (batch 1) and static-batched (batch 32, left padding, the batch runs to its longest
output) tokens/s, the ratios, and batch-1 decode latency per token for both.

    .venv/bin/python bench/offline_throughput.py [--model DIR] [--num-requests 32] [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import random
import time

import torch
import transformers

from hetero_core.builder import build_engine
from hetero_core.engine.params import SamplingParams
from hetero_core.logging import configure_logging
from hetero_core.model.embedded import ensure_embedded_model
from hetero_core.plugins import load_plugins
from hetero_core.settings import load_settings


def make_workload(num_requests: int, vocab_size: int, seed: int = 0):
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = rng.randint(16, 128)
        output_len = rng.randint(16, 64)
        # Avoid special tokens (SmolLM2 keeps them at the low ids).
        requests.append(([rng.randint(100, vocab_size - 1) for _ in range(prompt_len)], output_len))
    return requests


def run_engine(model_dir, requests, **settings) -> tuple[float, list[list[int]]]:
    engine = build_engine(load_settings(model=str(model_dir), executor="torch", **settings),
                          load_plugins(entry_points=[]))
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in requests]
    engine.generate([requests[0][0]], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    start = time.perf_counter()
    outputs = engine.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    engine.shutdown()
    return elapsed, [o.output_token_ids for o in outputs]


def hf_generate(model, batch_ids: list[list[int]], max_new: int, pad_id: int) -> torch.Tensor:
    width = max(len(ids) for ids in batch_ids)
    input_ids = torch.full((len(batch_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch_ids), width), dtype=torch.long)
    for row, ids in enumerate(batch_ids):  # left padding
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    with torch.inference_mode():
        return model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new,
                              min_new_tokens=max_new, do_sample=False, pad_token_id=pad_id)


def run_hf_sequential(model, requests, pad_id) -> float:
    start = time.perf_counter()
    for ids, n in requests:
        hf_generate(model, [ids], n, pad_id)
    return time.perf_counter() - start


def run_hf_static(model, requests, pad_id, batch_size: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        chunk = requests[i:i + batch_size]
        hf_generate(model, [ids for ids, _ in chunk], max(n for _, n in chunk), pad_id)
    return time.perf_counter() - start


def decode_latency_engine(model_dir, prompt, n: int) -> float:
    """Seconds per decoded token for one request (time after the first token / tokens after it)."""
    engine = build_engine(load_settings(model=str(model_dir), executor="torch"),
                          load_plugins(entry_points=[]))
    engine.generate([prompt], SamplingParams(temperature=0, max_tokens=2))
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n + 1, ignore_eos=True))
    engine.step()  # prefill + first token
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return (time.perf_counter() - start) / n


def decode_latency_hf(model, prompt, n: int, pad_id: int) -> float:
    hf_generate(model, [prompt], 2, pad_id)
    start = time.perf_counter()
    hf_generate(model, [prompt], 1, pad_id)
    first = time.perf_counter() - start
    start = time.perf_counter()
    hf_generate(model, [prompt], n + 1, pad_id)
    return (time.perf_counter() - start - first) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="HF model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="HF static batch size")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--skip-sequential", action="store_true", help="skip the slow HF batch-1 run")
    args = parser.parse_args()
    configure_logging(level="warning")
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model or ensure_embedded_model()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad_id = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    requests = make_workload(args.num_requests, model.config.vocab_size)
    num_tokens = sum(n for _, n in requests)

    print(f"machine: {platform.machine()} {platform.processor() or ''} cores={torch.get_num_threads()} threads, "
          f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"workload: {len(requests)} requests, prompt tokens {sum(len(p) for p, _ in requests)}, "
          f"output tokens {num_tokens}, greedy, ignore_eos")

    engine_s, engine_tokens = run_engine(model_dir, requests)
    assert [len(t) for t in engine_tokens] == [n for _, n in requests]
    engine_tps = num_tokens / engine_s
    print(f"hetero engine:          {engine_s:7.2f} s  {engine_tps:8.1f} output tokens/s")

    static_s = run_hf_static(model, requests, pad_id, args.batch_size)
    static_tps = num_tokens / static_s
    print(f"HF static batch {args.batch_size:>3}:    {static_s:7.2f} s  {static_tps:8.1f} output tokens/s")
    if not args.skip_sequential:
        seq_s = run_hf_sequential(model, requests, pad_id)
        seq_tps = num_tokens / seq_s
        print(f"HF sequential (batch 1): {seq_s:7.2f} s  {seq_tps:8.1f} output tokens/s")
        print(f"ratio engine / HF sequential:   {engine_tps / seq_tps:5.2f}x")
    print(f"ratio engine / HF static batch: {engine_tps / static_tps:5.2f}x")

    prompt, _ = requests[0]
    engine_lat = decode_latency_engine(model_dir, prompt, 64)
    hf_lat = decode_latency_hf(model, prompt, 64, pad_id)
    print(f"batch-1 decode latency: hetero {engine_lat * 1000:6.1f} ms/token, HF {hf_lat * 1000:6.1f} ms/token, "
          f"ratio HF / hetero {hf_lat / engine_lat:4.2f}x")


if __name__ == "__main__":
    main()
