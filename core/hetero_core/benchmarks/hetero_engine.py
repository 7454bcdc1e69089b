"""Hetero's engine as the reference side of ``hetero bench offline`` (the row every ratio is to)."""

from __future__ import annotations

import time

from hetero_core.benchmarks.peers import PeerResult
from hetero_core.benchmarks.workload import Request
from hetero_core.engine.params import SamplingParams


class HeteroPeer:
    name, label = "hetero", "hetero engine"

    def __init__(self, settings) -> None:
        from hetero_core.builder import build_engine, resolve_model_dir
        from hetero_core.plugin_system.discovery import load_plugins

        plugins = load_plugins(allow=settings.plugins)
        self.engine = build_engine(settings, plugins)
        executor = plugins.registry.get("executor", settings.component_name("executor"))
        self.model_dir = resolve_model_dir(settings) if executor.traits.get("needs_model") else None
        dtype = getattr(self.engine.executor, "dtype", None)
        self.dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
        self.vocab_size = self.engine.tokenizer.vocab_size
        self.executor_name = executor.name
        self.engine.generate([[self.vocab_size - 1] * 8], SamplingParams(temperature=0, max_tokens=2))  # warm-up

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
        return PeerResult(elapsed, sum(map(len, token_ids)),
                          {"num_steps": self.engine.stats().num_steps - steps_before, "token_ids": token_ids})

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
        self.engine.shutdown()
