"""A stand-in for the ``vllm`` package, for testing Hetero's vLLM benchmark peer without vLLM.

Written from vLLM's documented offline API: ``LLM(model=..., dtype=..., ...)``,
``LLM.generate(prompts, sampling_params, use_tqdm=False)`` returning ``RequestOutput`` objects whose
``outputs[0].token_ids`` hold the generated ids, ``SamplingParams(temperature, max_tokens, ignore_eos)``
and ``vllm.inputs.TokensPrompt(prompt_token_ids=...)``. Its "model" emits ``(last id + 1) % 1000``,
so answers are deterministic; ``get_tokenizer().encode(text)`` gives one id per character.
``FAKE_VLLM_FAIL_ON_GENERATE=N`` makes the N-th generate call raise;
``FAKE_VLLM_SECONDS_PER_TOKEN`` makes each token take that long (a decode that can be timed).
"""

import os
import time
from dataclasses import dataclass

__version__ = "0.0.0-fake"
_calls = 0
_SECONDS_PER_TOKEN = float(os.environ.get("FAKE_VLLM_SECONDS_PER_TOKEN", "0"))


@dataclass
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False


@dataclass
class CompletionOutput:
    token_ids: list


@dataclass
class RequestOutput:
    prompt_token_ids: list
    outputs: list


class LLM:
    def __init__(self, model, dtype="auto", enforce_eager=False, **kwargs):
        if not os.path.isdir(model):
            raise ValueError(f"model {model} is not a directory")
        self.kwargs = {"dtype": dtype, "enforce_eager": enforce_eager, **kwargs}

    def get_tokenizer(self):
        return _Tokenizer()

    def generate(self, prompts, sampling_params, use_tqdm=True):
        global _calls
        _calls += 1
        if str(_calls) == os.environ.get("FAKE_VLLM_FAIL_ON_GENERATE"):
            raise RuntimeError("fake vLLM failure")
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        results = []
        for prompt, params in zip(prompts, sampling_params):
            ids, last = [], prompt["prompt_token_ids"][-1]
            for _ in range(params.max_tokens):
                time.sleep(_SECONDS_PER_TOKEN)
                last = (last + 1) % 1000
                ids.append(last)
            results.append(RequestOutput(prompt["prompt_token_ids"], [CompletionOutput(ids)]))
        return results


class _Tokenizer:
    """Its ``encode``: one id per character (``ord % 1000``)."""

    def encode(self, text):
        return [ord(c) % 1000 for c in text]
