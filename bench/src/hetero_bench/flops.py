"""Arithmetic for ``hetero bench offline``: the workload's matmul FLOPs and this machine's GEMM ceiling.

``achieved GFLOP/s = workload FLOPs / elapsed`` says how close an engine computes to what the CPU can
do; the ceiling is a large ``torch.matmul`` measured in the same run (fp32 and bf16).
"""

from __future__ import annotations

import time

from hetero_bench.workload import Request


def workload_flops(config: dict, requests: list[Request]) -> float:
    """Matmul FLOPs of running ``requests`` on a Llama-family model (HF ``config.json`` fields):
    the layers' linears for every token the model computes (the prompt and every output token but
    the last), the LM head for every sampled row, and attention (scores and values) over each
    token's context. Element-wise work (norms, RoPE, softmax) is left out."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = (
        config["num_attention_heads"],
        config.get("num_key_value_heads") or config["num_attention_heads"],
    )
    head_dim = config.get("head_dim") or hidden // heads
    linear_per_token = (
        2
        * layers
        * (
            hidden * (heads + 2 * kv_heads) * head_dim  # q, k, v
            + heads * head_dim * hidden  # o
            + 3 * hidden * config["intermediate_size"]
        )
    )  # gate, up, down
    total = 0.0
    for request in requests:
        computed = len(request.prompt_token_ids) + request.max_tokens - 1
        total += linear_per_token * computed + 2 * hidden * config["vocab_size"] * request.max_tokens
        total += 4 * layers * heads * head_dim * computed * (computed + 1) / 2  # token i attends i+1 keys
    return total


def gemm_ceiling_gflops(dtype_name: str, budget_s: float = 2.0) -> tuple[float, int]:
    """(GFLOP/s, n) of the best of a few ``n^3`` ``torch.matmul`` in ``dtype_name``: n = 2048, or
    512 where the dtype is so slow here (bf16 emulated on a CPU without native bf16) that 2048 would
    take many seconds."""
    import torch

    dtype = getattr(torch, dtype_name)
    size = 512
    rate = _best_rate(dtype, size, repeats=2)
    if 2 * 2048**3 / (rate * 1e9) < budget_s / 4:
        size = 2048
        rate = _best_rate(dtype, size, repeats=5)
    return rate, size


def _best_rate(dtype, size: int, repeats: int) -> float:
    import torch

    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9
