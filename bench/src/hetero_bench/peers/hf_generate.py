"""HF transformers ``generate`` as a peer: the same model in the same dtype, greedy, EOS ignored.

- ``hf``: static batches of ``--hf-batch-size`` prompts (left padding; each batch runs to its
  longest output, ``min_new_tokens = max_new_tokens``): what a simple batch script does.
- ``hf-sequential``: one request at a time (batch 1, no padding): slow, the floor.
"""

from __future__ import annotations

import functools
import time

from hetero_bench.peers import PeerContext, PeerResult, PeerUnavailable
from hetero_bench.workload import Request


class HFGeneratePeer:
    def __init__(self, ctx: PeerContext, batch_size: int, name: str, label: str) -> None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            raise PeerUnavailable(
                "HF transformers is not installed (pip install transformers torch)"
            ) from None
        if ctx.model_dir is None:
            raise PeerUnavailable("needs a real model, and this executor runs none (use --executor torch)")
        self.name, self.label, self.batch_size = name, label, batch_size
        self.model = _load_model(str(ctx.model_dir), ctx.dtype or "float32")
        eos = self.model.config.eos_token_id
        self.pad_id = eos if isinstance(eos, int) else 0

    def run(self, requests: list[Request]) -> PeerResult:
        start = time.perf_counter()
        num_tokens = 0
        for i in range(0, len(requests), self.batch_size):
            chunk = requests[i : i + self.batch_size]
            longest = max(r.max_tokens for r in chunk)
            self._generate([r.prompt_token_ids for r in chunk], longest)
            num_tokens += sum(r.max_tokens for r in chunk)  # the padded extra tokens are not counted
        return PeerResult(time.perf_counter() - start, num_tokens, {"batch_size": self.batch_size})

    def decode_latency(self, prompt: list[int], num_tokens: int) -> float:
        self._generate([prompt], 2)  # warm-up
        start = time.perf_counter()
        self._generate([prompt], 1)
        first = time.perf_counter() - start
        start = time.perf_counter()
        self._generate([prompt], num_tokens + 1)
        return (time.perf_counter() - start - first) / num_tokens

    def _generate(self, batch: list[list[int]], max_new: int):
        import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # left padding
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        with torch.inference_mode():
            return self.model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                pad_token_id=self.pad_id,
            )


@functools.lru_cache(maxsize=1)
def _load_model(model_dir: str, dtype: str):
    """One copy of the model for both HF peers."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()


PEERS = {
    "hf": lambda ctx: HFGeneratePeer(
        ctx, ctx.hf_batch_size, "hf", f"HF generate, static batch {ctx.hf_batch_size}"
    ),
    "hf-sequential": lambda ctx: HFGeneratePeer(ctx, 1, "hf-sequential", "HF generate, sequential (batch 1)"),
}
