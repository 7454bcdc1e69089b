"""Hetero's side of ``hetero bench memory``: one engine in a process of its own, started the way
``hetero run`` starts it (default settings over ``HETERO_*`` variables, the model directory, an
optional dtype), driven over stdin/stdout with ``vllm_worker.py``'s protocol so both engines are
measured by the same code: after its first token of ``--first-prompt`` (a raw completion) it prints
``{"event": "ready", ...}``, then answers ``{"cmd": "decode_latency", "prompt": [...], "n": 64}``
with ``{"s_per_token"}`` (one request; the time of ``n`` more tokens than a 1-token request, as vLLM's
worker times it) and stops at ``{"cmd": "quit"}``.

Run as ``python -m hetero_bench.hetero_worker --model DIR [--dtype D] [--executor NAME]``. The
engine's logs go to stderr; stdout carries the protocol only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

START = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--dtype")
    parser.add_argument("--executor")
    parser.add_argument("--first-prompt", default="The capital of France is")
    args = parser.parse_args()
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # anything else printed goes to stderr

    import hetero_core
    from hetero_core import LLM, SamplingParams, load_settings

    flags = {
        k: v for k, v in (("model", args.model), ("dtype", args.dtype), ("executor", args.executor)) if v
    }
    llm = LLM.from_settings(load_settings(None, **flags))
    loaded = time.perf_counter() - START
    first = llm.generate([args.first_prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    if first.error:
        raise SystemExit(f"Error: the first request failed: {first.error}")
    first_token = time.perf_counter() - START
    version = getattr(hetero_core, "__version__", "unknown")
    _send(protocol, {"event": "ready", "load_s": loaded, "first_token_s": first_token, "version": version})

    def generate(prompt: list[int], num_tokens: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
        start = time.perf_counter()
        output = llm.generate([prompt], params, use_tqdm=False)[0]
        if output.error:
            raise SystemExit(f"Error: a decode request failed: {output.error}")
        return time.perf_counter() - start

    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] == "quit":
                break
            if command["cmd"] == "decode_latency":
                prompt, n = command["prompt"], command["n"]
                generate(prompt, 2)  # warm
                one = generate(prompt, 1)
                whole = generate(prompt, n + 1)
                _send(protocol, {"s_per_token": (whole - one) / n})
    finally:
        llm.shutdown()


def _send(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


if __name__ == "__main__":
    main()
