"""ArchitectureContract: the tests every model architecture passes against Hugging Face transformers,
as a mixin a plugin's test suite subclasses.

```python
from hetero_core.testing import ArchitectureContract
import my_plugin                             # the module with register_model_architectures

class TestMyArchitecture(ArchitectureContract):
    plugin = my_plugin                       # None: core's own architectures

    def make_hf_model(self):                 # a tiny randomly initialised transformers model, fp32, eval()
        config = transformers.MyConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, ...)
        return transformers.AutoModelForCausalLM.from_config(config)
```

The kit saves the HF model (safetensors) to a temporary directory, registers ``plugin``'s
architectures (``extra_plugins``, so the plugin need not be installed) and checks, in fp32 on the
CPU through the torch executor:

- the checkpoint's ``config.json`` parses to the architecture it names;
- logits equal HF's within ``logits_atol`` at every position, a prompt prefilled in one step then
  decoded token by token over shuffled, non-contiguous blocks, and the same prompt prefilled in chunks;
- greedy tokens through the engine equal HF's greedy over ``num_greedy_tokens`` tokens for several
  prompts at once, with chunked prefill and a pool so small that sequences are preempted (recompute
  and swap); where the two best HF logits are within ``logits_atol`` (a near tie) either token is
  accepted and the comparison of that prompt stops there;
- the executor contract (``ExecutorContract``) with HF as the greedy reference.

Imports torch and transformers only inside the checks.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from hetero_core.testing.contract_failure import ContractFailure
from hetero_core.testing.paged import BlockPool, ContractSequence, build_batch


class ArchitectureContract:
    plugin: Any = None
    plugin_name: str = "architecture-under-test"
    logits_atol: float = 1e-3
    block_size: int = 4
    prompt_length: int = 37
    num_decode_tokens: int = 12
    num_greedy_tokens: int = 160
    num_prompts: int = 3
    vocab_size: int | None = None  # None: the HF config's

    # -- what a plugin provides -------------------------------------------------------------------
    def make_hf_model(self):
        raise NotImplementedError("subclass ArchitectureContract and implement make_hf_model()")

    # -- the world the checks run in ----------------------------------------------------------------
    def model_dir(self) -> Path:
        """The HF model saved once per test class (its directory lives as long as the class)."""
        cls = type(self)
        if cls.__dict__.get("_saved") is None:
            import torch

            torch.manual_seed(0)
            hf_model = self.make_hf_model().eval()
            directory = tempfile.TemporaryDirectory(prefix="hetero-architecture-")
            hf_model.save_pretrained(directory.name, safe_serialization=True)
            cls._saved = (directory, hf_model)
        return Path(cls._saved[0].name)

    def hf_model(self):
        self.model_dir()
        return type(self)._saved[1]

    def plugin_set(self):
        from hetero_core.plugin_system.discovery import load_plugins
        from hetero_core.plugin_system.installed import install_architectures

        extra = [] if self.plugin is None else [(self.plugin_name, self.plugin)]
        plugins = load_plugins(entry_points=[], extra_plugins=extra)
        install_architectures(plugins.registry.architectures)
        return plugins

    def teardown_method(self, method=None) -> None:
        from hetero_core.plugin_system.installed import install_architectures

        install_architectures(None)

    def vocab(self) -> int:
        return self.vocab_size or self.hf_model().config.vocab_size

    def tokens(self, count: int, seed: int) -> list[int]:
        generator = random.Random(seed)
        return [generator.randrange(2, self.vocab()) for _ in range(count)]

    def hf_logits(self, token_ids: list[int]):
        import torch

        with torch.no_grad():
            return self.hf_model()(torch.tensor([token_ids])).logits[0].float()

    def make_executor(self, num_blocks: int = 64):
        from hetero_core.default_plugins.torch_executor import TorchExecutor
        from hetero_core.default_plugins.torch_options import TorchExecutorOptions
        from hetero_core.executor import ExecutorContext

        self.plugin_set()
        ctx = ExecutorContext(
            settings=None,
            options=TorchExecutorOptions(dtype="float32"),
            model_dir=self.model_dir(),
            num_blocks=num_blocks,
            block_size=self.block_size,
            max_model_len=1024,
            max_num_batched_tokens=1024,
            max_num_seqs=8,
            eos_token_id=None,
            vocab_size=self.vocab(),
        )
        return TorchExecutor(ctx)

    # -- the checks ---------------------------------------------------------------------------------
    def test_config_json_names_a_registered_architecture(self):
        import json

        from hetero_core.model.config import ModelConfig

        self.plugin_set()
        raw = json.loads((self.model_dir() / "config.json").read_text())
        config = ModelConfig.from_dir(self.model_dir())
        if config.architecture not in raw["architectures"]:
            raise ContractFailure(
                "config.json's architecture is the one parsed",
                f"config.json names {raw['architectures']}, parsed as {config.architecture}",
            )

    def test_logits_match_hf_prefill_then_decode_over_shuffled_blocks(self):
        tokens = self.tokens(self.prompt_length + self.num_decode_tokens, seed=1)
        expected = self.hf_logits(tokens)
        executor = self.make_executor()
        seq, pool = ContractSequence(0, tokens, self.prompt_length), BlockPool(64, shuffle=True)
        rows = [executor.execute(build_batch([(seq, self.prompt_length)], pool, self.block_size)).logits[0]]
        for _ in range(self.num_decode_tokens - 1):
            rows.append(executor.execute(build_batch([(seq, 1)], pool, self.block_size)).logits[0])
        self._check_rows(rows, expected, self.prompt_length - 1, "prefill then decode")
        executor.shutdown()

    def test_logits_match_hf_with_chunked_prefill_beside_another_sequence(self):
        tokens, other = self.tokens(self.prompt_length + 4, seed=2), self.tokens(13, seed=3)
        expected = self.hf_logits(tokens)
        executor = self.make_executor()
        pool = BlockPool(64, shuffle=True, seed=1)
        seq, neighbour = ContractSequence(0, tokens, self.prompt_length), ContractSequence(1, other, 9)
        rows = []
        while seq.num_remaining:
            segments = [(seq, max(1, min(7, self.prompt_length - seq.num_computed)))]
            if neighbour.num_remaining:  # its prompt in chunks of 5, then decodes
                segments.append((neighbour, max(1, min(5, 9 - neighbour.num_computed))))
            batch = build_batch(segments, pool, self.block_size)
            logits = executor.execute(batch).logits
            if batch.sample[0]:  # the first sequence's row comes first
                rows.append(logits[0])
        self._check_rows(rows, expected, self.prompt_length - 1, "chunked prefill")
        executor.shutdown()

    def test_greedy_matches_hf_through_the_engine_with_chunks_and_preemption(self):
        from hetero_core.builder import build_engine
        from hetero_core.engine.requests.params import SamplingParams
        from hetero_core.settings import load_settings

        prompts = [self.tokens(8 + 5 * i, seed=10 + i) for i in range(self.num_prompts)]
        expected = [self.hf_greedy(p, self.num_greedy_tokens) for p in prompts]
        blocks_per_seq = -(-(max(map(len, prompts)) + self.num_greedy_tokens) // self.block_size)
        params = SamplingParams(temperature=0, max_tokens=self.num_greedy_tokens, ignore_eos=True)
        for mode in ("recompute", "swap"):
            settings = load_settings(
                model=str(self.model_dir()),
                executor="torch",
                tokenizer="byte",
                dtype="float32",
                block_size=self.block_size,
                max_model_len=blocks_per_seq * self.block_size,
                max_num_blocks=blocks_per_seq + 2,
                max_prefill_chunk=5,
                max_total_tokens=16,
                memory_threshold=1.0,
                preemption_mode=mode,
                num_swap_blocks=4 * blocks_per_seq,
                enable_prefix_caching=False,
            )
            engine = build_engine(settings, self.plugin_set())
            try:
                outputs = engine.generate(prompts, params)
            finally:
                engine.shutdown()
            if sum(out.num_preemptions for out in outputs) == 0:
                raise ContractFailure(
                    "the greedy check preempts sequences",
                    f"{mode}: no sequence was preempted; the check needs a smaller pool",
                )
            for prompt, out, want in zip(prompts, outputs, expected, strict=True):
                self._check_greedy(prompt, list(out.output_token_ids), want, mode)

    def test_passes_the_executor_contract(self):
        from hetero_core.default_plugins.torch_executor import TorchExecutor
        from hetero_core.default_plugins.torch_options import TorchExecutorOptions
        from hetero_core.testing.executor_contract import ExecutorContract

        outer = self

        class Contract(ExecutorContract):
            vocab_size = outer.vocab()
            model_dir = outer.model_dir()

            def executor_options(self):
                return TorchExecutorOptions(dtype="float32")

            def make_executor(self, ctx):
                outer.plugin_set()
                return TorchExecutor(ctx)

            def reference_greedy(self, prompt_token_ids, num_tokens):
                return [token for token, _ in outer.hf_greedy(prompt_token_ids, num_tokens)]

        kit = Contract()
        try:
            for name in sorted(dir(kit)):
                if name.startswith("test_"):
                    getattr(kit, name)()
        finally:
            kit.teardown_method(None)

    # -- helpers --------------------------------------------------------------------------------------
    def hf_greedy(self, prompt: list[int], num_tokens: int) -> list[tuple[int, bool]]:
        """HF's greedy tokens after ``prompt`` (argmax of its logits, no logits processors: EOS is a token
        like any other), each with whether it won by less than ``logits_atol``.

        Each token is the argmax of HF's plain forward over the whole sequence so far, recomputed for
        every token with no KV cache: HF's cached ``generate`` sums in another order, and in a MoE
        model a router near-tie (invisible in the final logits, so no tolerance can allow for it) can
        then pick other experts than HF's own forward does."""
        result, tokens = [], list(prompt)
        for _ in range(num_tokens):
            top = self.hf_logits(tokens)[-1].topk(2)
            result.append((int(top.indices[0]), bool(top.values[0] - top.values[1] < self.logits_atol)))
            tokens.append(result[-1][0])
        return result

    def _check_greedy(self, prompt, got: list[int], expected: list[tuple[int, bool]], label: str) -> None:
        for position, (token, (want, near_tie)) in enumerate(zip(got, expected, strict=True)):
            if token != want:
                if near_tie:
                    return  # either of two tied tokens is right; the sequences part here
                raise ContractFailure(
                    "greedy tokens through the engine equal HF's",
                    f"{label}: greedy token {position} after a {len(prompt)}-token prompt is "
                    f"{token}, HF's is {want} (first {position} tokens equal)",
                )

    def _check_rows(self, rows, expected, first: int, label: str) -> None:
        for offset, row in enumerate(rows):
            error = float((row.float() - expected[first + offset]).abs().max())
            if error > self.logits_atol:
                raise ContractFailure(
                    "logits equal HF's within logits_atol",
                    f"{label}: at position {first + offset} they differ by {error:.2e} "
                    f"(> logits_atol {self.logits_atol})",
                )
