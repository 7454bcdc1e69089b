"""Build a model from a config and a checkpoint's tensors: on the meta device (no random init), the
tensors assigned in place after fusing q/k/v and gate/up (``fusion``). The loader and the
tensor-parallel sharding both build through here."""

from __future__ import annotations

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import AttentionBackend, NoAttention
from hetero_core.model.config import ModelConfig
from hetero_core.model.fusion import checkpoint_names, fuse_checkpoint
from hetero_core.model.llama import LlamaForCausalLM

# Checkpoint keys that carry no weights we need (buffers some exporters save).
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def build_model(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    *,
    backend: AttentionBackend | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LlamaForCausalLM:
    """Instantiate the model without initialising it and assign ``state``'s tensors to it (``backend``
    None: weights only, see ``NoAttention``)."""
    backend = backend if backend is not None else NoAttention()
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend)
    names = list(model.state_dict().keys())
    expected = set(checkpoint_names(names, config))
    missing = sorted(expected - state.keys())
    unexpected = sorted(k for k in state.keys() - expected if not _is_ignorable(k, config))
    if missing or unexpected:
        raise ModelLoadError(
            f"checkpoint does not match {config.architecture}: missing {missing[:5]} unexpected {unexpected[:5]}"
            f" ({len(missing)} missing, {len(unexpected)} unexpected); is config.json from the same model?"
        )
    tensors = {
        name: tensor.to(device=device, dtype=dtype) for name, tensor in fuse_checkpoint(state, names, config).items()
    }
    try:
        model.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as exc:  # shape mismatches
        raise ModelLoadError(f"checkpoint does not match its config.json: {exc}") from exc
    model.requires_grad_(False)
    return model.eval()


def _is_ignorable(name: str, config: ModelConfig) -> bool:
    return name.endswith(_IGNORABLE_SUFFIXES) or (config.tie_word_embeddings and name == "lm_head.weight")
