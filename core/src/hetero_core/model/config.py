"""ModelConfig: the facts the model code needs, parsed once from an HF ``config.json``.

Accepts both spellings of RoPE settings: transformers 4 (``rope_theta`` + ``rope_scaling``) and
transformers 5 (``rope_parameters``). Anything we cannot run faithfully is a ``ModelLoadError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_core.errors import ModelLoadError

# The built-in Llama family (``llama_architecture``): architecture name -> the model-code variant.
LLAMA_FAMILY = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_ROPE_REQUIRED_KEYS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


@dataclass(frozen=True)
class ModelConfig:
    """The fields every architecture fills (the Llama family's set); an architecture with more
    subclasses it (frozen, with defaults) and its ``ModelArchitecture.config`` returns the subclass."""

    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None  # always has "rope_type" when set
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # HF's flag: bias on q/k/v/o (Llama, Qwen3); Qwen2 ignores it
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def variant(self) -> str:
        return LLAMA_FAMILY.get(self.architecture, self.architecture)

    @property
    def qkv_bias(self) -> bool:
        return self.variant == "qwen2" or self.attention_bias

    @property
    def o_proj_bias(self) -> bool:
        return self.variant != "qwen2" and self.attention_bias

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"no config.json in {model_dir}; expected a Hugging Face model directory")
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> ModelConfig:
        """Parse ``raw`` with the adapter of its architecture (``raw["architectures"]``), looked up
        in the process's registered architectures (``plugin_system.installed``)."""
        from hetero_core.plugin_system.installed import installed_architectures

        name, architecture = installed_architectures().for_config(raw)
        return architecture.config({**raw, "architectures": [name]}, source)


def parse_config(
    raw: dict[str, Any], source: str = "config", config_class: type = ModelConfig, **fields: Any
) -> ModelConfig:
    """The fields of ``ModelConfig`` read from ``raw`` the Llama way (an adapter's building block):
    ``fields`` override or add to them (a subclass's extra fields). A missing or malformed field is
    a ``ModelLoadError`` naming it; RoPE settings in either spelling (``rope_settings``)."""
    try:
        hidden_size = int(raw["hidden_size"])
        num_heads = int(raw["num_attention_heads"])
        rope_theta, rope_scaling = rope_settings(raw)
        values = dict(
            architecture=raw["architectures"][0],
            hidden_size=hidden_size,
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden_size // num_heads),
            intermediate_size=int(raw["intermediate_size"]),
            vocab_size=int(raw["vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=token_ids(raw.get("eos_token_id")),
        )
        return config_class(**{**values, **fields})
    except KeyError as exc:
        raise ModelLoadError(f"{source}: missing required field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{source}: invalid field value ({exc}); is this a Hugging Face config.json?"
        ) from exc


def rope_settings(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Return (rope_theta, scaling dict with "rope_type" or None for plain RoPE)."""
    params = dict(raw.get("rope_parameters") or {})
    legacy = dict(raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = params or legacy
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"unsupported rope_scaling type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    scaling = {**scaling, "rope_type": rope_type}
    if rope_type == "llama3":
        scaling.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings", 2048))
    missing = [k for k in _ROPE_REQUIRED_KEYS[rope_type] if k not in scaling]
    if missing:
        raise ModelLoadError(f"rope_scaling of type {rope_type!r} is missing {', '.join(missing)}")
    return theta, scaling


def token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)
