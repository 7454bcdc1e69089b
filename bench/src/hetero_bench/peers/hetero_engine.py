"""Hetero's engine as the reference side of ``hetero bench offline`` (the row every ratio is to)."""

from __future__ import annotations

import time

from hetero_bench.memory import process_rss_mb
from hetero_bench.peers import PeerResult
from hetero_bench.workload import Request
from hetero_core import LLM, SamplingParams


class HeteroPeer:
    name, label = "hetero", "hetero engine"

    def __init__(self, settings) -> None:
        self.llm = LLM.from_settings(settings)
        self.engine = self.llm.engine
        self.model_dir = self.llm.model_dir
        dtype = getattr(self.engine.executor, "dtype", None)
        self.dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
        self.vocab_size = self.llm.get_tokenizer().vocab_size
        self.executor_name = settings.component_name("executor")
        self.engine.generate(
            [[self.vocab_size - 1] * 8], SamplingParams(temperature=0, max_tokens=2)
        )  # warm-up

    def run(self, requests: list[Request]) -> PeerResult:
        params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests]
        steps_before = self.engine.stats().num_steps
        start = time.perf_counter()
        outputs = self.engine.generate([r.prompt_token_ids for r in requests], params)
        elapsed = time.perf_counter() - start
        failed = [o.error for o in outputs if o.error]
        if failed:
            raise RuntimeError(f"the engine failed {len(failed)} request(s): {failed[0]}")
        token_ids = [list(o.output_token_ids) for o in outputs]
        return PeerResult(
            elapsed,
            sum(map(len, token_ids)),
            {
                "num_steps": self.engine.stats().num_steps - steps_before,
                "token_ids": token_ids,
                "rss_mb": process_rss_mb(),
            },
        )

    def decode_latency(self, prompt: list[int], num_tokens: int) -> float:
        """Seconds per token of one request's decode, after its prefill and first token."""
        engine = self.engine
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=num_tokens + 1, ignore_eos=True))
        engine.step()  # prefill + first token
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        return (time.perf_counter() - start) / num_tokens

    def close(self) -> None:
        self.llm.shutdown()
