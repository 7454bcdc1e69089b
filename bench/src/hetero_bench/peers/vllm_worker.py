"""The vLLM side of ``hetero bench offline --peers vllm...``: run by *vLLM's own* Python (a separate
venv), driven over stdin/stdout by ``vllm_cpu.VllmCpuPeer``. It imports only the standard library
and vLLM, never hetero_core or hetero_bench, so it runs in a venv that has vLLM and nothing of ours.

Protocol: one JSON object per line. After loading it prints ``{"event": "ready", ...}`` with the
load time and the time to its first generated token (of ``--first-prompt``, tokenized by vLLM's
tokenizer, or of three fixed token ids); then it answers each command line:

- ``{"cmd": "offline", "requests": [[prompt_ids, max_tokens], ...]}`` -> ``{"elapsed_s", "output_tokens",
  "token_ids"}``: all requests submitted together (greedy, EOS ignored), timed around ``generate``;
- ``{"cmd": "decode_latency", "prompt": [...], "n": 64}`` -> ``{"s_per_token"}``: one request, time of
  ``n`` extra decoded tokens (the prefill and first token subtracted);
- ``{"cmd": "quit"}``.

vLLM's own logs go to stderr; stdout carries the protocol only. An exception ends the worker, and
the peer reports the last error line of its log.
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
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--eager", action="store_true", help="enforce_eager=True (no torch.compile)")
    parser.add_argument(
        "--first-prompt", help="the text of the first request (default: token ids 100, 101, 102)"
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=0.15,
        help="gpu_memory_utilization: on the CPU backend, the share of RAM vLLM reserves",
    )
    args = parser.parse_args()
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # anything vLLM prints goes to stderr

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=args.eager,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.memory_fraction,
        seed=0,
        enable_prefix_caching=False,
    )  # every round repeats the same prompts
    loaded = time.perf_counter() - START
    greedy = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    first_ids = llm.get_tokenizer().encode(args.first_prompt) if args.first_prompt else [100, 101, 102]
    llm.generate([TokensPrompt(prompt_token_ids=first_ids)], greedy, use_tqdm=False)
    first_token = time.perf_counter() - START
    import vllm

    _send(
        protocol,
        {"event": "ready", "load_s": loaded, "first_token_s": first_token, "version": vllm.__version__},
    )

    def generate(requests):
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in requests]
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in requests]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outputs]

    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        if command["cmd"] == "offline":
            elapsed, token_ids = generate(command["requests"])
            _send(
                protocol,
                {"elapsed_s": elapsed, "output_tokens": sum(map(len, token_ids)), "token_ids": token_ids},
            )
        elif command["cmd"] == "decode_latency":
            prompt, n = command["prompt"], command["n"]
            generate([(prompt, 2)])  # warm
            first, _ = generate([(prompt, 1)])
            whole, _ = generate([(prompt, n + 1)])
            _send(protocol, {"s_per_token": (whole - first) / n})


def _send(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


if __name__ == "__main__":
    main()
