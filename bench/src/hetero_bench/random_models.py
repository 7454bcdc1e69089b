"""Models made from a config with random weights: any benchmark runs a checkpoint of a given shape
without downloading it.

``--model random:NAME[:DTYPE]`` (every benchmark's engine flag) makes, once, an HF directory under
``<cache_dir>/random-models/``: ``config.json``, plain safetensors in DTYPE (``bfloat16``, the
default, or ``float32``; shards of at most ~2 GB with an index, each tensor made and written in turn,
so an 8B checkpoint is made in under 2 GB of RAM) and the embedded SmolLM2's tokenizer
files (its vocabulary, 49,152 tokens, is every shape's), so Hetero, HF ``generate`` and vLLM load
the same directory. NAME is a shape of ``SHAPES`` or a path to a ``config.json`` (its shape keys;
the vocabulary stays the tokenizer's). Later runs reuse the directory (a ``random-model.json``
written last marks it complete).

The weights: every linear and the embedding ~ N(0, 0.02^2), norms 1, drawn in fp32 from a
generator seeded by the tensor's name, so a shape's fp32 and bf16 checkpoints hold the same model
(the bf16 one rounded). They have no structure to exploit (no block codes, unlike the embedded
GGUF's): the path a plain fp32 or bf16 checkpoint takes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from hetero_bench.safetensors_stream import num_bytes
from hetero_core import HeteroError

PREFIX = "random:"
VOCAB_SIZE = 49152  # the embedded SmolLM2 tokenizer's
STD = 0.02
SHARD_BYTES = 2 << 30
FORMAT = 1  # bump when the files written change: a new directory
_COMMON = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "vocab_size": VOCAB_SIZE,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SHAPES = {
    # SmolLM2-360M's shape (hidden 960, 32 layers, 15 heads / 5 KV heads, intermediate 2560, tied)
    "smollm2-360m": {
        "hidden_size": 960,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
        "head_dim": 64,
        "intermediate_size": 2560,
        "rope_theta": 100000.0,
    },
    # Llama-3.2-1B's layers (hidden 2048, 16 layers, 32 heads / 8 KV heads, intermediate 8192, tied)
    # with SmolLM2's vocabulary: 1.07 B parameters
    "llama-1b": {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 8192,
        "rope_theta": 500000.0,
    },
    # Llama-3.2-3B's layers (hidden 3072, 28 layers, 24 heads / 8 KV heads, intermediate 8192, tied):
    # 3.0 B parameters with SmolLM2's vocabulary, 6.0 GB in bf16
    "llama-3b": {
        "hidden_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 8192,
        "rope_theta": 500000.0,
    },
    # Llama-3.1-8B's layers (hidden 4096, 32 layers, 32 heads / 8 KV heads, intermediate 14336, an
    # untied lm_head): 7.4 B parameters with SmolLM2's vocabulary, 14.8 GB in bf16, 8 shards
    "llama-8b": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
}
_SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
)
DTYPES = ("bfloat16", "float32")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
MARKER = "random-model.json"


def is_random_spec(model: str | None) -> bool:
    return bool(model) and str(model).startswith(PREFIX)


def resolve_random_model(spec: str, cache_dir: Path | None = None) -> Path:
    """``random:NAME[:DTYPE]`` -> the model's directory, made on first use."""
    config, dtype, name = parse_spec(spec)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    digest = hashlib.sha256(json.dumps([FORMAT, config, dtype], sort_keys=True).encode()).hexdigest()[:10]
    target = root / "random-models" / f"{name}-{dtype}-{digest}"
    if not (target / MARKER).is_file():
        write_random_model(target, config, dtype)
    return target


def parse_spec(spec: str) -> tuple[dict, str, str]:
    """``random:NAME[:DTYPE]`` -> (the HF config, the dtype, a name for the directory)."""
    body = spec.removeprefix(PREFIX)
    name, dtype = body, "bfloat16"
    head, _, tail = body.rpartition(":")
    if head and tail in DTYPES:
        name, dtype = head, tail
    if name in SHAPES:
        shape = SHAPES[name]
    elif name.endswith(".json") and Path(name).expanduser().is_file():
        try:
            raw = json.loads(Path(name).expanduser().read_text())
        except (OSError, ValueError) as exc:
            raise HeteroError(f"--model {spec}: cannot read {name}: {exc}") from None
        shape = {k: raw[k] for k in _SHAPE_KEYS if k in raw}
        missing = [k for k in _SHAPE_KEYS[:3] if k not in shape]
        if missing:
            raise HeteroError(
                f"--model {spec}: {name} has no {', '.join(missing)}; give an HF Llama config.json"
            )
        name = Path(name).stem
    else:
        raise HeteroError(
            f"--model {spec}: unknown shape {name!r}; available: {', '.join(SHAPES)}, or a path to a "
            f"config.json; optionally :DTYPE ({' or '.join(DTYPES)}), e.g. random:smollm2-360m:float32"
        )
    return {**_COMMON, **shape, "torch_dtype": dtype}, dtype, name


def default_cache_dir() -> Path:
    """The engine's cache (``$HETERO_CACHE_DIR`` or ``~/.cache/hetero``)."""
    env = os.environ.get("HETERO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hetero"


def write_random_model(target: Path, config: dict, dtype: str) -> None:
    """The directory at ``target``: config, random weights, the tokenizer (written beside it, then
    renamed into place; a concurrent maker's finished directory wins). Each tensor is made, written
    and dropped in turn (``safetensors_stream``): an 8B checkpoint is made in under 2 GB of RAM."""
    import torch

    from hetero_bench.safetensors_stream import plan_shards, write_streamed

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        copy_tokenizer(tmp, target.parent.parent)
        entries = tensor_shapes(config)
        shards = plan_shards(entries, dtype, SHARD_BYTES)

        def make(name: str, shape: tuple[int, ...]):
            return random_tensor(name, shape).to(getattr(torch, dtype))

        if len(shards) == 1:
            write_streamed(tmp / "model.safetensors", entries, dtype, make)
        else:
            weight_map = {}
            for number, shard in enumerate(shards, 1):
                name = f"model-{number:05d}.safetensors"
                write_streamed(tmp / name, shard, dtype, make)
                weight_map.update(dict.fromkeys((tensor for tensor, _ in shard), name))
            total = sum(num_bytes(shape, dtype) for _, shape in entries)
            (tmp / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
            )
        (tmp / MARKER).write_text(json.dumps({"format": FORMAT, "std": STD, "dtype": dtype}))
        try:
            tmp.rename(target)
        except OSError:
            if not (target / MARKER).is_file():  # not a concurrent maker's finished directory
                shutil.rmtree(target, ignore_errors=True)
                tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tensor_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The checkpoint's tensor names (Hugging Face's) and shapes, in order."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = (
        config["num_attention_heads"],
        config.get("num_key_value_heads", config["num_attention_heads"]),
    )
    head_dim = config.get("head_dim") or hidden // heads
    names = [("model.embed_tokens.weight", (config["vocab_size"], hidden))]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        names += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
            (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
            (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    names.append(("model.norm.weight", (hidden,)))
    if not config.get("tie_word_embeddings", False):
        names.append(("lm_head.weight", (config["vocab_size"], hidden)))
    return names


def random_tensor(name: str, shape: tuple[int, ...]):
    """fp32: ones for a norm, else N(0, STD^2) from a generator seeded by ``name``."""
    import torch

    if len(shape) == 1:
        return torch.ones(shape)
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") & ((1 << 63) - 1)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).mul_(STD)


def tokenizer_source(cache_dir: Path) -> Path:
    """The embedded SmolLM2's converted directory (converted once, in the same cache)."""
    from hetero_core.model.embedded import ensure_embedded_model

    return ensure_embedded_model(cache_dir)


def copy_tokenizer(folder: Path, cache_dir: Path) -> None:
    source = tokenizer_source(cache_dir)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
    if not (folder / "tokenizer.json").is_file():
        raise HeteroError(f"the embedded model at {source} has no tokenizer.json to give the random model")
