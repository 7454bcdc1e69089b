"""A Qwen3-MoE and the dense Qwen3 of the same active parameters, random weights, made once in the
cache (``<cache_dir>/random-models/moe-...``) for ``hetero bench moe``.

Same attention (16 heads of 64, 4 KV heads; q/k norms), hidden size, layers and vocabulary (the byte
tokenizer's ids, 256 tokens: the LM head costs little, the MLPs are what differ); the MoE's experts
``expert_size`` wide, the dense MLP ``top_k * expert_size``. Weights ~ N(0, 0.02^2) seeded by name
(``random_models.random_tensor``), stored in ``dtype``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from hetero_bench.random_models import default_cache_dir, random_tensor

VOCAB = 256
FORMAT = 1


def moe_pair(
    *,
    hidden: int,
    layers: int,
    experts: int,
    top_k: int,
    expert_size: int,
    dtype: str,
    cache_dir: Path | None = None,
) -> dict[str, Path]:
    """``{"moe": directory, "dense": directory}``, each made on first use."""
    heads = max(1, hidden // 64)
    common = {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 4),
        "head_dim": 64,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": dtype,
    }
    configs = {
        "moe": {
            **common,
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "intermediate_size": top_k * expert_size,
            "moe_intermediate_size": expert_size,
            "num_experts": experts,
            "num_experts_per_tok": top_k,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        "dense": {
            **common,
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "intermediate_size": top_k * expert_size,
        },
    }
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dirs = {}
    for name, config in configs.items():
        digest = hashlib.sha256(json.dumps([FORMAT, config], sort_keys=True).encode()).hexdigest()[:10]
        target = root / "random-models" / f"moe-bench-{name}-{digest}"
        if not (target / "config.json").is_file():
            _write(target, config, dtype)
        dirs[name] = target
    return dirs


def _write(target: Path, config: dict, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {name: random_tensor(name, shape).to(getattr(torch, dtype)) for name, shape in _shapes(config)}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=1))  # last: marks the directory complete
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def _shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = [
        ("model.embed_tokens.weight", (config["vocab_size"], hidden)),
        ("model.norm.weight", (hidden,)),
        ("lm_head.weight", (config["vocab_size"], hidden)),
    ]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (q, hidden)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, q)),
            (p + "self_attn.q_norm.weight", (head_dim,)),
            (p + "self_attn.k_norm.weight", (head_dim,)),
        ]
        if "num_experts" in config:
            size = config["moe_intermediate_size"]
            shapes.append((p + "mlp.gate.weight", (config["num_experts"], hidden)))
            for e in range(config["num_experts"]):
                shapes += [
                    (f"{p}mlp.experts.{e}.gate_proj.weight", (size, hidden)),
                    (f"{p}mlp.experts.{e}.up_proj.weight", (size, hidden)),
                    (f"{p}mlp.experts.{e}.down_proj.weight", (hidden, size)),
                ]
        else:
            size = config["intermediate_size"]
            shapes += [
                (p + "mlp.gate_proj.weight", (size, hidden)),
                (p + "mlp.up_proj.weight", (size, hidden)),
                (p + "mlp.down_proj.weight", (hidden, size)),
            ]
    return shapes
