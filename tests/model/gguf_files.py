"""Test helper: GGUF files made with gguf's own writer. ``requantized``: a copy of a GGUF with every
quantized 2-D tensor re-quantized to another type (its metadata and tokenizer copied); ``write_mixed_gguf``:
a tiny Llama whose tensors are random raw blocks of the types given (any bytes are a valid block; the
f16 scales are set to small finite values so the activations stay finite)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize, quantize

# Byte offsets of each type's f16 scales inside its block.
F16_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
}


def requantized(source: Path, target: Path, type_name: str) -> Path:
    """``source`` with its quantized tensors re-quantized to ``type_name`` (through their fp32 values)."""
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(target), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        types = [GGUFValueType(t) for t in field.types]
        writer.add_key_value(key, field.contents(), types[0], sub_type=types[1] if len(types) > 1 else None)
    qtype = GGMLQuantizationType[type_name]
    for tensor in reader.tensors:
        if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(tensor.name, np.asarray(tensor.data, dtype=np.float32).copy())
            continue
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, quantize(values, qtype), raw_dtype=qtype)
    _write(writer)
    return target


def random_raw(type_name: str, rows: int, columns: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """[rows, row bytes] random blocks of ``type_name``, their f16 scales ~ N(0, ``scale``)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    raw = rng.integers(0, 256, size=(rows, columns // block, size), dtype=np.uint8)
    for offset in F16_OFFSETS[type_name]:
        scales = (rng.standard_normal((rows, columns // block)) * scale).astype(np.float16)
        raw[..., offset : offset + 2] = scales[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def write_mixed_gguf(
    path: Path, types: dict[str, str], *, hidden=256, ffn=512, heads=4, kv_heads=2, vocab=256, layers=2
):
    """A ``layers``-layer Llama GGUF (tied embeddings, no tokenizer) whose tensor ``blk.<i>.<name>`` (or
    ``token_embd``) is ``types[name or "<i>.<name>"]`` (default Q8_0), random raw blocks; norms F32."""
    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    head_dim = hidden // heads
    shapes = {
        "attn_q": (heads * head_dim, hidden),
        "attn_k": (kv_heads * head_dim, hidden),
        "attn_v": (kv_heads * head_dim, hidden),
        "attn_output": (hidden, heads * head_dim),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }
    _add(writer, "token_embd.weight", types.get("token_embd", "Q8_0"), (vocab, hidden), rng)
    for layer in range(layers):
        for name, shape in shapes.items():
            type_name = types.get(f"{layer}.{name}", types.get(name, "Q8_0"))
            _add(writer, f"blk.{layer}.{name}.weight", type_name, shape, rng)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(
                f"blk.{layer}.{norm}.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
            )
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    _write(writer)
    return path


def _add(writer, name: str, type_name: str, shape: tuple[int, int], rng) -> None:
    rows, columns = shape
    scale = 0.5 / columns**0.5 / 16  # weights of roughly 1/sqrt(columns): codes reach ~16 (or 63 * 16)
    if type_name == "F32":
        writer.add_tensor(name, (rng.standard_normal(shape) / columns**0.5).astype(np.float32))
        return
    if type_name in ("Q4_K", "Q5_K", "Q2_K", "Q3_K", "Q6_K"):
        scale /= 32  # times 6-bit (or int8) sub-block scales
    raw = random_raw(type_name, rows, columns, rng, scale)
    writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[type_name])


def _write(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def mixed_types():
    """Every code type in fused and plain linears, mixed bits inside q/k/v and gate/up, Q6_K alone
    and as a part beside 32-input types (split), and a type without codes (Q2_K: one warning)."""
    return {
        "token_embd": "Q4_K",
        "0.attn_q": "Q4_K",
        "0.attn_k": "Q5_K",
        "0.attn_v": "Q8_0",
        "0.attn_output": "Q6_K",
        "0.ffn_gate": "Q4_1",
        "0.ffn_up": "Q4_1",
        "0.ffn_down": "Q5_0",
        "1.attn_q": "Q4_K",
        "1.attn_k": "Q4_0",
        "1.attn_v": "Q6_K",
        "1.attn_output": "Q5_1",
        "1.ffn_gate": "Q5_K",
        "1.ffn_up": "Q6_K",
        "1.ffn_down": "Q2_K",
    }
