"""Make the tiny GGUF fixtures of this folder (run once by hand; README.md says how they were made).

A tiny llama (hidden 256, intermediate 256, 2 layers, 4 heads of 64, 2 KV heads, a 256-token vocab:
every row a multiple of 256, as the k-quants' super-blocks need) with seeded random weights is
written as F32 with gguf-py's writer, then each type is made from it by llama.cpp's own quantizer
(``llama-quantize``): ``--pure`` for the single-type files (no Q6_K output, no Q4_K embedding: each
file holds its type only), the Q4_K_M and Q5_K_M per-tensor mixes as llama.cpp makes them.

    python tests/data/gguf/make_fixtures.py quantize /path/to/llama-quantize
    python tests/data/gguf/make_fixtures.py reference /path/to/dump_dequantized

The F32 source is not kept (it is the largest file); the quantized files are. ``reference`` runs
``dump_dequantized`` (``dump_dequantized.c``, built against llama.cpp's ggml: README.md) on each file
and keeps what ggml's own dequantization gave, per tensor, in ``llama_cpp_dequantized.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

HERE = Path(__file__).parent
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 256, 2, 4, 2, 256
# file stem -> (llama-quantize type, pure: every 2-D tensor of that one type)
FIXTURES = {
    "tiny-Q4_0": ("Q4_0", True),
    "tiny-Q4_1": ("Q4_1", True),
    "tiny-Q5_0": ("Q5_0", True),
    "tiny-Q5_1": ("Q5_1", True),
    "tiny-Q8_0": ("Q8_0", True),
    "tiny-Q4_K": ("Q4_K", True),
    "tiny-Q5_K": ("Q5_K", True),
    "tiny-Q6_K": ("Q6_K", True),
    "tiny-Q4_K_M": ("Q4_K_M", False),
    "tiny-Q5_K_M": ("Q5_K_M", False),
}


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: <unk>, <s>, </s>, then byte pieces (metadata only: nothing
    here tokenizes text)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(VOCAB - 3)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * (VOCAB - 3)
    return tokens, [0.0] * VOCAB, [int(t) for t in types]


def write_f32(path: Path, seed: int = 37) -> None:
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def weights(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("hetero-tiny-llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = tiny_vocab()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_tensor("token_embd.weight", weights(VOCAB, HIDDEN))
    for i in range(LAYERS):
        writer.add_tensor(
            f"blk.{i}.attn_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32)
        )
        writer.add_tensor(f"blk.{i}.attn_q.weight", weights(HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weights(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weights(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weights(HIDDEN, HEADS * head_dim))
        writer.add_tensor(
            f"blk.{i}.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32)
        )
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(INTERMEDIATE, HIDDEN))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(INTERMEDIATE, HIDDEN))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(HIDDEN, INTERMEDIATE))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", weights(VOCAB, HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_quantized(quantize: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "tiny-F32.gguf"
        write_f32(source)
        for stem, (qtype, pure) in FIXTURES.items():
            flags = ["--pure"] if pure else []
            subprocess.run([quantize, *flags, str(source), str(HERE / f"{stem}.gguf"), qtype], check=True)


def make_reference(dump: str) -> None:
    reference = {}
    for stem in FIXTURES:
        done = subprocess.run([dump, str(HERE / f"{stem}.gguf")], check=True, capture_output=True, text=True)
        tensors = [json.loads(line) for line in done.stdout.splitlines()]
        reference[stem.removeprefix("tiny-")] = {
            t.pop("name"): {**t, "type": t["type"].upper()} for t in tensors
        }
    (HERE / "llama_cpp_dequantized.json").write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    commands = {"quantize": make_quantized, "reference": make_reference}
    if len(sys.argv) != 3 or sys.argv[1] not in commands:
        sys.exit("usage: python tests/data/gguf/make_fixtures.py {quantize LLAMA_QUANTIZE | reference DUMP}")
    commands[sys.argv[1]](sys.argv[2])
