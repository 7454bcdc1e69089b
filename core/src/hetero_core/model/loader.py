"""Load a model (any registered architecture) from a local HF directory, a GGUF file, or a hub id.

The module is built on the meta device (no random init) and the checkpoint tensors are assigned
in place one decoder layer at a time (``model_builder``), so a 135M model loads in about a second
from safetensors and no model is ever held twice. Checkpoint names are Hugging
Face's; q/k/v and gate/up are concatenated into the model's fused projections (``fusion``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import AttentionBackend
from hetero_core.model.causal_lm import CausalLM
from hetero_core.model.checkpoint_tensors import CheckpointTensors
from hetero_core.model.config import ModelConfig
from hetero_core.model.gguf_cache import check_converted_weights
from hetero_core.model.model_builder import GroupLoaded, build_model
from hetero_core.model.pipeline_stage import StageLink, prune_stage, stage_checkpoint
from hetero_core.model.source import resolve_model_source
from hetero_core.model.tensor_parallel import build_shard


def load_model(
    source: str | Path,
    *,
    backend: AttentionBackend | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    tensor_parallel=None,
    pipeline_stage=None,
    on_group: GroupLoaded | None = None,
) -> CausalLM:
    """Load ``source`` (HF directory, ``.gguf`` file or hub id) ready for inference.

    ``backend``: the attention backend the model runs with (None: a model for its weights only, whose
    attention raises). ``tensor_parallel``: a ``tensor_parallel.TensorParallelShard`` to load only that
    rank's shard. ``on_group(model, prefix)``: called once each layer's weights (then the rest's) are in
    place, before the next are read (``model_builder.build_model``). ``pipeline_stage``: a
    ``pipeline_stage.PipelineStage`` to load only that stage's layers (and embedding or head), linked
    to its neighbours (``model.pipeline``)."""
    config, state = read_checkpoint(resolve_model_source(source))
    options = dict(backend=backend, device=device, dtype=dtype, on_group=on_group)
    if pipeline_stage is not None:
        return load_stage(config, state, pipeline_stage, tensor_parallel, **options)
    if tensor_parallel is not None:
        return build_shard(config, state, tensor_parallel, **options)
    return build_model(config, state, **options)


def read_checkpoint(path: Path) -> tuple[ModelConfig, CheckpointTensors]:
    """Config and tensors (HF names, CPU, each read when asked for: ``checkpoint_tensors``) of an HF
    directory or a GGUF file."""
    if path.is_dir():
        from hetero_core.model.safetensors_checkpoint import read_safetensors

        check_converted_weights(
            path
        )  # a converted GGUF's weights: checked before use, converted again if damaged
        config = ModelConfig.from_dir(path)
        return config, read_safetensors(path)
    if path.suffix == ".gguf":
        from hetero_core.model.checkpoint_tensors import GGUFTensors
        from hetero_core.model.gguf_checkpoint import gguf_config, gguf_tensor, hf_tensor_name, open_gguf

        reader = open_gguf(path)
        raw = gguf_config(reader, path)
        tensors = GGUFTensors(reader, hf_tensor_name, lambda tensor: gguf_tensor(tensor, raw))
        return ModelConfig.from_dict(raw, source=str(path)), tensors
    raise ModelLoadError(f"cannot load {path}: expected a directory with config.json or a .gguf file")


def load_stage(config: ModelConfig, state, stage, shard, **options) -> CausalLM:
    """Pipeline stage ``stage``'s model (its tensor-parallel shard of it with ``shard``), linked to
    its neighbours."""
    local, state = stage_checkpoint(state, config, stage)
    link = StageLink(stage, config.hidden_size, options["dtype"])

    def prune(model) -> None:  # linked before loading: an earlier stage's model never grows a head
        prune_stage(model, stage)
        model.pipeline = link

    options["prune"] = prune
    if shard is not None:
        return build_shard(local, state, shard, **options)
    return build_model(local, state, **options)
