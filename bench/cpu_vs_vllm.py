"""Hetero vs vLLM's CPU backend: same model, same requests, same machine, one run, alternating.

Workload (the CPU-speed issue's): SmolLM2-135M-Instruct, 32 requests, seed 0, random-token prompts
of U[16,128] tokens, outputs of U[16,64] tokens, greedy, EOS ignored, all submitted at once. Each
contender keeps its engine loaded; the rounds alternate between contenders (vLLM's processes are
SIGSTOPped while the others run) and every figure is the median over rounds. Also printed: the
GEMM ceiling measured in this run (a 2048^3 matmul, fp32 and bf16) beside the GFLOP/s each
contender achieved, batch-1 decode latency, and load time to the first token.

    .venv/bin/python bench/cpu_vs_vllm.py [--rounds 3] [--hetero-dtypes auto,float32,bfloat16]
        [--vllm-configs float32:compiled,bfloat16:compiled] [--json out.json]

vLLM runs from its own venv (``.venv-vllm``, or ``--vllm-python``; see
``hetero_core/benchmarks/vllm_peer.py`` for its set-up); without it the peer is skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from hetero_core import LLM, SamplingParams
from hetero_core.benchmarks.vllm_peer import PeerUnavailable, VllmConfig, VllmCpuPeer, find_vllm_python
from hetero_core.model.compute_dtype import cpu_flags
from hetero_core.model.embedded import ensure_embedded_model

REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_bf16",
                  "amx_tile")


def make_workload(num_requests: int, vocab_size: int, seed: int = 0):
    """The same generator as bench/offline_throughput.py (ids from 100 up: SmolLM2's special tokens are low)."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = rng.randint(16, 128)
        output_len = rng.randint(16, 64)
        requests.append(([rng.randint(100, vocab_size - 1) for _ in range(prompt_len)], output_len))
    return requests


def machine_info() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    flags = cpu_flags()
    return {"cpu": model, "flags": [f for f in REPORTED_FLAGS if f in flags], "cpus": len(__import__("os").sched_getaffinity(0)),
            "torch": torch.__version__, "python": platform.python_version(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def gemm_ceiling(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of a size^3 torch.matmul in ``dtype`` (best of ``repeats``)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def workload_flops(config: dict, requests) -> float:
    """Matmul FLOPs of the workload: linears for every token, the LM head for every sampled row
    (one per prompt plus one per further output token), attention scores and values over the context."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    per_token = 2 * layers * (hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * inter)
    tokens = sum(len(p) + n - 1 for p, n in requests)  # the last output token is never fed back
    sampled = sum(n for _, n in requests)
    attention = 0
    for prompt, n in requests:
        for position in range(len(prompt) + n - 1):
            attention += 4 * layers * heads * head_dim * (position + 1)
    return per_token * tokens + 2 * hidden * vocab * sampled + attention


class HeteroContender:
    def __init__(self, model_dir: str, dtype: str):
        self.dtype = dtype
        self.llm = LLM(model=model_dir, executor={"name": "torch", "torch": {"dtype": dtype}})
        resolved = self.llm.engine.executor.dtype if hasattr(self.llm.engine.executor, "dtype") else dtype
        self.label = f"Hetero torch dtype={dtype}" + (f" ({str(resolved).removeprefix('torch.')})" if dtype == "auto" else "")
        self.llm.generate([[100, 101, 102]], SamplingParams(temperature=0, max_tokens=2))  # warm-up

    def offline(self, requests) -> dict:
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in requests]
        start = time.perf_counter()
        outputs = self.llm.generate([p for p, _ in requests], params)
        elapsed = time.perf_counter() - start
        token_ids = [list(o.output_token_ids) for o in outputs]
        return {"elapsed_s": elapsed, "output_tokens": sum(map(len, token_ids)), "token_ids": token_ids}

    def decode_latency(self, prompt, n: int) -> float:
        engine = self.llm.engine
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n + 1, ignore_eos=True))
        engine.step()  # prefill + first token
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        return (time.perf_counter() - start) / n

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None:
        self.llm.shutdown()


def hetero_first_token_s(dtype: str, runs: int = 3) -> float:
    """Median wall time of ``hetero run --max-tokens 1`` in a fresh process (model cache warm)."""
    hetero = Path(sys.executable).with_name("hetero")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([str(hetero), "run", "--max-tokens", "1", "--temperature", "0", "--executor", "torch",
                        "--dtype", dtype, "What is the capital of France?"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[int, float]:
    """(requests whose greedy tokens are identical, mean share of each request's tokens equal up to the first difference)."""
    same = sum(x == y for x, y in zip(a, b))
    prefix = []
    for x, y in zip(a, b):
        k = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        prefix.append(k / max(len(x), 1))
    return same, statistics.mean(prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--hetero-dtypes", default="auto", help="comma-separated: auto,float32,bfloat16")
    parser.add_argument("--vllm-configs", default="float32:compiled,bfloat16:compiled",
                        help="comma-separated DTYPE:MODE (MODE compiled|eager); empty: no vLLM")
    parser.add_argument("--vllm-python", help="vLLM's interpreter (default: .venv-vllm/bin/python)")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--log", default="vllm_peer.log", help="where the vLLM workers' own logs go")
    args = parser.parse_args()

    model_dir = str(ensure_embedded_model())
    config = json.loads((Path(model_dir) / "config.json").read_text())
    requests = make_workload(args.num_requests, config["vocab_size"])
    prompt_tokens, output_tokens = sum(len(p) for p, _ in requests), sum(n for _, n in requests)
    flops = workload_flops(config, requests)
    info = machine_info()
    print(f"machine: {info['cpu']}, {info['cpus']} CPUs, flags {' '.join(info['flags'])}; "
          f"python {info['python']}, torch {info['torch']} (capability {info['torch_cpu_capability']})")
    print(f"workload: {len(requests)} requests, {prompt_tokens} prompt + {output_tokens} output tokens, "
          f"{flops / 1e12:.3f} TFLOP of matmuls, greedy, ignore_eos")
    ceiling = {"float32": gemm_ceiling(torch.float32), "bfloat16": gemm_ceiling(torch.bfloat16)}
    print(f"GEMM ceiling (2048^3 torch.matmul): fp32 {ceiling['float32']:.0f} GFLOP/s, "
          f"bf16 {ceiling['bfloat16']:.0f} GFLOP/s")

    contenders = [HeteroContender(model_dir, dtype) for dtype in args.hetero_dtypes.split(",") if dtype]
    vllm_configs = [VllmConfig.parse(c) for c in args.vllm_configs.split(",") if c]
    vllm_version = None
    if vllm_configs:
        try:
            python = find_vllm_python(args.vllm_python)
            for vc in vllm_configs:
                print(f"starting {vc.label} ...", flush=True)
                peer = VllmCpuPeer(python, model_dir, vc, Path(args.log))
                vllm_version = peer.ready["version"]
                print(f"  ready after {peer.ready['spawn_to_ready_s']:.1f} s", flush=True)
                contenders.append(peer)
        except PeerUnavailable as exc:
            print(exc)

    results = {c.label: {"rounds": []} for c in contenders}
    outputs = {}
    for round_index in range(args.rounds):
        order = contenders if round_index % 2 == 0 else contenders[::-1]
        for contender in order:
            result = contender.offline(requests)
            outputs[contender.label] = result.pop("token_ids")
            tps = result["output_tokens"] / result["elapsed_s"]
            results[contender.label]["rounds"].append(result["elapsed_s"])
            print(f"round {round_index + 1}: {contender.label:40s} {result['elapsed_s']:7.2f} s  {tps:7.1f} tok/s",
                  flush=True)
    for contender in contenders:
        entry = results[contender.label]
        entry["elapsed_s"] = statistics.median(entry["rounds"])
        entry["tokens_per_s"] = output_tokens / entry["elapsed_s"]
        entry["gflops"] = flops / entry["elapsed_s"] / 1e9
        entry["decode_ms_per_token"] = 1e3 * contender.decode_latency(requests[0][0], args.decode_tokens)
        if isinstance(contender, VllmCpuPeer):
            entry["first_token_s"] = contender.ready["first_token_s"]
            entry["load_s"] = contender.ready["load_s"]
        else:
            entry["first_token_s"] = hetero_first_token_s(contender.dtype)
    for contender in contenders:
        contender.close()

    hetero_default = contenders[0].label
    peers = [c.label for c in contenders if isinstance(c, VllmCpuPeer)]
    best_peer = max(peers, key=lambda label: results[label]["tokens_per_s"]) if peers else None
    print()
    print(f"{'system':44s} {'tok/s':>8s} {'GFLOP/s':>8s} {'b1 decode ms/tok':>17s} {'to 1st token s':>15s}")
    for label, entry in results.items():
        print(f"{label:44s} {entry['tokens_per_s']:8.1f} {entry['gflops']:8.1f} "
              f"{entry['decode_ms_per_token']:17.1f} {entry['first_token_s']:15.2f}")
    ratios = {}
    if best_peer:
        ratio = results[hetero_default]["tokens_per_s"] / results[best_peer]["tokens_per_s"]
        ratios["hetero_default_over_best_vllm"] = ratio
        print(f"ratio {hetero_default} / best vLLM ({best_peer}): {ratio:.2f}x")
        for peer in peers:
            b1 = results[peer]["decode_ms_per_token"] / results[hetero_default]["decode_ms_per_token"]
            print(f"  vs {peer}: throughput {results[hetero_default]['tokens_per_s'] / results[peer]['tokens_per_s']:.2f}x, "
                  f"batch-1 decode {b1:.2f}x faster")
            same, prefix = agreement(outputs[hetero_default], outputs[peer])
            print(f"  greedy tokens vs {peer}: {same}/{len(requests)} requests identical, "
                  f"{100 * prefix:.1f}% of tokens before the first difference")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": info, "vllm": vllm_version, "gemm_ceiling_gflops": ceiling,
            "workload": {"requests": len(requests), "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                         "tflop": flops / 1e12},
            "results": results, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
