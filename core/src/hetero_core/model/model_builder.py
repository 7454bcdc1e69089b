"""Build a model from a config and a checkpoint's tensors: its architecture's module (registered
through ``register_model_architectures``) on the meta device (no random init), the tensors assigned
in place after the architecture's weight mapping (the Llama family's fuses q/k/v and gate/up,
``fusion``). The loader and the tensor-parallel sharding both build through here."""

from __future__ import annotations

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import AttentionBackend, NoAttention
from hetero_core.model.config import ModelConfig
from hetero_core.plugin_system.installed import architecture_of

CAUSAL_LM_METHODS = ("forward", "sampled_logits", "compute_logits", "untie_lm_head")


def build_model(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    *,
    backend: AttentionBackend | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.nn.Module:
    """Instantiate the model without initialising it and assign ``state``'s tensors to it (``backend``
    None: weights only, see ``NoAttention``)."""
    backend = backend if backend is not None else NoAttention()
    architecture = architecture_of(config)
    with torch.device("meta"):
        model = architecture.build(config, backend)
    check_causal_lm(model, config)
    names = list(model.state_dict().keys())
    weights = architecture.weights
    expected = set(weights.checkpoint_names(names, config))
    missing = sorted(expected - state.keys())
    unexpected = sorted(k for k in state.keys() - expected if not _is_ignored(k, weights, config))
    if missing or unexpected:
        raise ModelLoadError(
            f"checkpoint does not match {config.architecture}: missing {missing[:5]} "
            f"unexpected {unexpected[:5]}"
            f" ({len(missing)} missing, {len(unexpected)} unexpected); is config.json from the same model?"
        )
    tensors = {
        name: tensor.to(device=device, dtype=dtype)
        for name, tensor in weights.from_checkpoint(state, names, config).items()
    }
    try:
        model.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as exc:  # shape mismatches
        raise ModelLoadError(f"checkpoint does not match its config.json: {exc}") from exc
    model.requires_grad_(False)
    return model.eval()


def check_causal_lm(model, config: ModelConfig) -> None:
    """Refuse, naming the architecture, a built module that lacks what ``CausalLM`` promises."""
    missing = [name for name in CAUSAL_LM_METHODS if not callable(getattr(model, name, None))]
    missing += [name for name in ("config", "backend") if not hasattr(model, name)]
    if missing:
        raise ModelLoadError(
            f"architecture {config.architecture}: its build() returned a {type(model).__name__} "
            f"without {', '.join(missing)}; it must implement hetero_core.architectures.CausalLM"
        )


def _is_ignored(name: str, weights, config: ModelConfig) -> bool:
    """A checkpoint tensor the module does not take that is not an error: one its architecture ignores
    (``WeightMapping.ignored``), or the lm_head of a model that ties it to the embeddings."""
    return weights.ignored(name, config) or (config.tie_word_embeddings and name == "lm_head.weight")
