"""Core's ``draft`` proposer: a smaller model of the target's tokenizer proposes the next tokens greedily.

The draft model runs on core's torch executor (``TorchExecutor``: core's model code, ``ModelRunner`` over
its own ``PagedKVCache``, the compiled CPU kernels on the CPU, the target's device on a GPU) with a KV pool
of its own (``draft_blocks``). Per sequence it remembers which tokens its cache holds; ``propose`` finds
the prefix they share with the sequence's tokens now (what the target rejected last step falls outside
it and is simply overwritten), runs every sequence's missing tokens as one batched step, then
``num_tokens - 1`` batched greedy decode steps. Greedy proposals are deterministic, which the engine's
acceptance rule needs to keep the target's distribution. A sequence that finds no free draft block, or
whose proposal would pass the draft model's position limit, gets no (or a shorter) proposal that step:
it never fails the request.
"""

from __future__ import annotations

from pathlib import Path

from hetero_core.default_plugins.draft_batch import Segment, draft_batch
from hetero_core.default_plugins.draft_blocks import DraftBlockPool, common_prefix
from hetero_core.default_plugins.draft_options import EMBEDDED_DRAFT, DraftProposerOptions
from hetero_core.default_plugins.draft_vocab import check_same_vocabulary
from hetero_core.engine.speculation.proposer import ProposalInput, ProposerContext
from hetero_core.logging import get_logger

log = get_logger("hetero.speculative")
GPU_EXECUTORS = ("cuda", "triton")


class DraftProposer:
    """Proposes with the model of ``[speculative_proposer.draft] model`` (``DraftProposerOptions``)."""

    def __init__(self, ctx: ProposerContext, options: DraftProposerOptions | None = None):
        options = options or ctx.options or DraftProposerOptions()
        self.model_dir = resolve_draft_model(options.model, ctx.cache_dir)
        config = _read_config(self.model_dir)
        check_same_vocabulary(ctx.model_dir, self.model_dir, ctx.vocab_size, config.get("vocab_size", -1))
        self.vocab_size = min(
            ctx.vocab_size, config.get("vocab_size", ctx.vocab_size)
        )  # ids the target knows
        self.max_positions = (
            config.get("max_position_embeddings") or ctx.max_model_len + ctx.num_speculative_tokens
        )
        self.block_size = ctx.block_size
        num_blocks = options.num_blocks or getattr(ctx.target_executor, "num_blocks", None) or 1024
        self.pool = DraftBlockPool(num_blocks, ctx.block_size)
        self.executor = build_draft_executor(ctx, options, self.model_dir, num_blocks, config)
        log.info(
            "proposer.draft",
            model=str(self.model_dir),
            num_blocks=num_blocks,
            dtype=str(self.executor.dtype).removeprefix("torch."),
            device=str(self.executor.device),
        )

    def propose(self, inputs: list[ProposalInput]) -> list[list[int]]:
        """Up to ``item.num_tokens`` greedy draft tokens after each ``item.token_ids``, in order."""
        proposals: list[list[int]] = [[] for _ in inputs]
        plans, segments = [], []
        for index, item in enumerate(inputs):
            tokens = list(item.token_ids)
            limit = min(item.num_tokens, self.max_positions - len(tokens) + 1)
            if limit <= 0 or not tokens or not self.pool.reserve(item.seq_id, len(tokens) + limit - 1):
                continue  # nothing to propose, past the position limit, or no free draft block
            seq = self.pool.sequence(item.seq_id)
            cached = min(common_prefix(seq.token_ids, tokens), len(tokens) - 1)  # the last token always runs
            del seq.token_ids[cached:]
            segments.append(Segment(item.seq_id, seq.blocks, cached, tokens[cached:]))
            plans.append((index, seq, limit))
        while segments:
            next_tokens = self._greedy(segments)
            next_plans, next_segments = [], []
            for segment, (index, seq, limit), token in zip(segments, plans, next_tokens):
                seq.token_ids.extend(segment.token_ids)  # their K/V are in the draft cache now
                proposals[index].append(token)
                if len(proposals[index]) < limit:
                    next_plans.append((index, seq, limit))
                    next_segments.append(Segment(segment.seq_id, seq.blocks, len(seq.token_ids), [token]))
            plans, segments = next_plans, next_segments
        return proposals

    def release(self, seq_id: int) -> None:
        """Free ``seq_id``'s draft blocks (finished, aborted or preempted: a later call starts it afresh)."""
        self.pool.release(seq_id)

    def shutdown(self) -> None:
        self.pool.sequences.clear()
        self.executor.shutdown()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def _greedy(self, segments: list[Segment]) -> list[int]:
        """One draft step over ``segments``: each segment's greedy next token."""
        logits = self.executor.execute(draft_batch(segments, self.block_size)).logits
        return logits[:, : self.vocab_size].argmax(dim=-1).tolist()


def resolve_draft_model(model: str, cache_dir: Path | None) -> Path:
    """The draft model's local HF directory (the embedded one converted once; a GGUF converted once)."""
    from hetero_core.errors import ConfigError
    from hetero_core.model.embedded import ensure_embedded_model
    from hetero_core.model.gguf_cache import ensure_gguf_converted
    from hetero_core.model.source import resolve_model_source

    if model == EMBEDDED_DRAFT:
        return ensure_embedded_model(cache_dir)
    path = resolve_model_source(model)
    if path.is_file() and path.suffix == ".gguf":
        return ensure_gguf_converted(path, cache_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"[speculative_proposer.draft] model {model!r}: expected an HF model directory (with "
            "config.json), a .gguf file or a hub id"
        )
    return path


def build_draft_executor(
    ctx: ProposerContext, options: DraftProposerOptions, model_dir: Path, num_blocks: int, config: dict
):
    """Core's torch executor over the draft model: the target's ``[executor.torch]`` options when the target
    runs on it, with the draft's ``dtype`` and ``device``; the rest of its context is the target's
    (``ctx.target_executor``) for one rank, no swap space."""
    import dataclasses

    from hetero_core.default_plugins.torch_executor import TorchExecutor
    from hetero_core.default_plugins.torch_options import TorchExecutorOptions
    from hetero_core.executor import ExecutorContext

    target_torch = target_torch_options(ctx)
    torch_options = TorchExecutorOptions(
        **{
            **target_torch,
            "dtype": options.dtype,
            "device": draft_device(ctx.executor, options, target_torch),
        }
    )
    target = ctx.target_executor or ExecutorContext(
        settings=None,
        options=None,
        model_dir=None,
        num_blocks=num_blocks,
        block_size=ctx.block_size,
        max_model_len=ctx.max_model_len,
        max_num_batched_tokens=ctx.max_model_len,
        max_num_seqs=ctx.max_num_seqs,
        eos_token_id=None,
        vocab_size=ctx.vocab_size,
    )
    settings = target.settings
    if settings is not None:  # the draft's pool is exactly num_blocks, never sized from memory (torch_memory)
        settings = settings.model_copy(update={"max_num_blocks": num_blocks})
    executor_ctx = dataclasses.replace(
        target,
        settings=settings,
        options=torch_options,
        model_dir=model_dir,
        num_blocks=num_blocks,
        block_size=ctx.block_size,
        max_model_len=ctx.max_model_len + ctx.num_speculative_tokens,
        max_num_seqs=ctx.max_num_seqs,
        eos_token_id=config.get("eos_token_id"),
        vocab_size=config.get("vocab_size"),
        num_swap_blocks=0,
        tensor_parallel_size=1,
        tensor_parallel_rank=0,
        enable_expert_parallel=False,
        pipeline_parallel_size=1,
        pipeline_parallel_rank=0,
    )
    return TorchExecutor(executor_ctx)


def target_torch_options(ctx: ProposerContext) -> dict:
    """The target's ``[executor.torch]`` options (those it set) when the target runs on the torch
    executor, else {}."""
    target_options = getattr(ctx.target_executor, "options", None)
    if ctx.executor != "torch" or target_options is None:
        return {}
    return target_options.model_dump(exclude_unset=True)


def draft_device(executor: str, options: DraftProposerOptions, target_torch: dict) -> str:
    """The draft's device: its ``device`` option, else the target torch executor's, else ``cuda`` under a
    GPU executor (cuda, triton), else ``cpu``."""
    return options.device or target_torch.get("device") or ("cuda" if executor in GPU_EXECUTORS else "cpu")


def _read_config(model_dir: Path) -> dict:
    import json

    from hetero_core.errors import ModelLoadError

    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the draft model's {path}: {exc}") from None
