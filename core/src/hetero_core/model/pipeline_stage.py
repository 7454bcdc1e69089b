"""Pipeline parallelism in the model code: one stage's share of the layers, and its link to its
neighbours over ``torch.distributed``.

A stage's model is the ordinary ``LlamaForCausalLM`` built for its run of decoder layers only
(``pipeline_plan.stage_layers``; local layer ``i`` is the checkpoint's ``first + i``), with what other
stages run left out before any weight is read: the token embedding lives on the first stage only,
the final norm and the LM head on the last (a model with tied embeddings keeps the embedding table
on the last stage too: it is the head's weight). Its KV cache therefore holds its layers only,
while the block tables and slot mappings are the engine's, the same on every stage.

Between stages travel the last layer's two outputs, ``hidden`` and ``residual``, unadded (the next
stage's first norm adds them, as the next layer would at one stage), stacked into one
``[2, num_tokens, hidden_size]`` tensor: one ``isend`` from each rank to the rank with the same
tensor-parallel index in the next stage (every rank of a stage has the full hidden states after its
all-reduces). The receiving stage knows the shape from the batch it got from rank 0, so nothing but
the activations crosses. Composes with tensor parallelism: a stage's ranks form their own process
group for the Megatron collectives (``TensorParallelShard.group``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from hetero_core.model.checkpoint_tensors import DerivedTensors
from hetero_core.model.config import ModelConfig
from hetero_core.model.pipeline_plan import check_pipeline_parallel_size, stage_layers

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")


@dataclass(frozen=True)
class PipelineStage:
    """Stage ``stage`` of ``size``, holding the decoder ``layers`` (global indices); ``rank``: this
    process's global rank, ``tensor_parallel_size`` ranks per stage (adjacent stages' ranks with the
    same tensor-parallel index exchange activations)."""

    stage: int
    size: int
    layers: range
    rank: int
    tensor_parallel_size: int = 1

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.size - 1

    @property
    def previous_rank(self) -> int:
        return self.rank - self.tensor_parallel_size

    @property
    def next_rank(self) -> int:
        return self.rank + self.tensor_parallel_size

    def keeps_embedding(self, config: ModelConfig) -> bool:
        """The first stage looks tokens up; the last uses a tied table as its LM head."""
        return self.is_first or (self.is_last and config.tie_word_embeddings)


def stage_of(ctx, num_layers: int) -> PipelineStage | None:
    """An executor's stage (None without pipeline parallelism), from its context."""
    size = getattr(ctx, "pipeline_parallel_size", 1)
    if size == 1:
        return None
    stage, tp = ctx.pipeline_parallel_rank, ctx.tensor_parallel_size
    return PipelineStage(
        stage, size, stage_layers(num_layers, size, stage), stage * tp + ctx.tensor_parallel_rank, tp
    )


def stage_checkpoint(
    state: Mapping[str, torch.Tensor], config: ModelConfig, stage: PipelineStage
) -> tuple[ModelConfig, DerivedTensors]:
    """The stage's config (its layers' count) and checkpoint: its layers renumbered from 0, the
    embedding, final norm and LM head only where the stage keeps them; nothing is read here."""
    check_pipeline_parallel_size(config, stage.size)
    names: dict[str, str] = {}
    for name in state:
        match = _LAYER.match(name)
        if match is not None:
            index = int(match.group(1))
            if index in stage.layers:
                names[f"model.layers.{index - stage.layers.start}.{match.group(2)}"] = name
        elif name.startswith("model.embed_tokens."):
            if stage.keeps_embedding(config):
                names[name] = name
        elif name.startswith(("model.norm.", "lm_head.")):
            if stage.is_last:
                names[name] = name
        else:
            names[name] = name
    local = replace(config, num_hidden_layers=len(stage.layers))
    return local, DerivedTensors(names, lambda name: state[names[name]])


def prune_stage(model: torch.nn.Module, stage: PipelineStage) -> None:
    """Drop the modules other stages run from a just-built (meta) stage model."""
    if not stage.keeps_embedding(model.config):
        model.model.embed_tokens = None
    if not stage.is_last:
        model.model.norm = None
        model.lm_head = None


class StageLink:
    """A stage's ends of the pipeline: ``receive`` the previous stage's ``(hidden, residual)``,
    ``send`` its own to the next stage (blocking point-to-point ops of the default group)."""

    def __init__(self, stage: PipelineStage, hidden_size: int, dtype: torch.dtype):
        self.stage = stage
        self.hidden_size = hidden_size
        self.dtype = dtype
        self._sending: tuple | None = None  # the last isend's work and tensor

    @property
    def is_first(self) -> bool:
        return self.stage.is_first

    @property
    def is_last(self) -> bool:
        return self.stage.is_last

    def receive(self, num_tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        both = torch.empty((2, num_tokens, self.hidden_size), dtype=self.dtype, device=device)
        if num_tokens:
            dist.recv(both, src=self.stage.previous_rank)
        return both[0], both[1]

    def send(self, hidden: torch.Tensor, residual: torch.Tensor) -> None:
        """Sent without waiting for the next stage to take it (``isend``): with two steps in flight
        the next stage may still be busy with the step before, and its answer to rank 0 (the
        logits, larger than a socket's buffer) waits for rank 0 to read it, so a blocking send here
        would wait on a stage that waits on us. The send before is waited for first (one in flight
        per link, its tensor kept alive until then)."""
        if not hidden.shape[0]:
            return
        self.wait_sent()
        both = torch.stack([hidden, residual]).to(self.dtype)
        self._sending = (dist.isend(both, dst=self.stage.next_rank), both)

    def wait_sent(self) -> None:
        if self._sending is not None:
            self._sending[0].wait()
            self._sending = None
