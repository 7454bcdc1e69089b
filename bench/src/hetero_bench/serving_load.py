"""The load generator of ``hetero bench serving``: streaming completions, vLLM's serving metrics.

Metrics follow vLLM's serving benchmark (benchmarks/serve.py):
- TTFT: request sent to first streamed token; E2E: request sent to last chunk.
- TPOT per request: (E2E - TTFT) / (output tokens - 1), for requests with more than one token.
- ITL: the gaps between consecutive streamed chunks, pooled over all requests.
- request throughput: completed requests / wall time of the level; output token throughput: output
  tokens (the server's usage counts) / wall time; total token throughput adds the prompt tokens.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

REQUEST_TIMEOUT_S = 600


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


async def send_one(client, base_url: str, model: str, prompt: list[int], output_len: int) -> RequestResult:
    import httpx

    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    last = None
    result = RequestResult(ok=False)
    try:
        async with client.stream("POST", base_url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk["choices"]):
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
        result.e2e = time.perf_counter() - start
        result.ok = result.output_tokens > 0
    except httpx.HTTPError as exc:
        result.error = repr(exc)
    return result


async def run_level(
    base_url: str,
    model: str,
    prompts: list[list[int]],
    output_len: int,
    concurrency: int,
    request_rate: float,
    seed: int,
) -> tuple[list[RequestResult], float]:
    """Send every prompt with at most ``concurrency`` in flight, arriving at a Poisson ``request_rate``
    (inf: all at once); the results and the wall time."""
    import httpx

    limit = asyncio.Semaphore(concurrency)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def limited(prompt):
            async with limit:
                return await send_one(client, base_url, model, prompt, output_len)

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def summarize(results: list[RequestResult], duration: float, concurrency: int) -> dict:
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "concurrency": concurrency,
        "num_requests": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "output_token_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + prompt_tokens) / duration,
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "ttft_ms": _stats([r.ttft for r in done]),
        "tpot_ms": _stats(tpots),
        "itl_ms": _stats([gap for r in done for gap in r.itls]),
        "e2e_ms": _stats([r.e2e for r in done]),
    }


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, max(0, int(round(0.99 * len(ordered) + 0.5)) - 1))]
    return {
        "mean": statistics.fmean(values) * 1e3,
        "median": statistics.median(values) * 1e3,
        "p99": p99 * 1e3,
    }
