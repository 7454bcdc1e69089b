"""The tiny GGUF fixtures of tests/data/gguf (one a type, made by llama.cpp's quantizer; README.md
there): each holds the types its name says, the ``gguf`` package dequantizes every tensor to what
llama.cpp's own ``to_float`` gave (``llama_cpp_dequantized.json``, dumped once from ggml), Hetero's
codes of every quantized matrix (``gguf_codes``, Q6_K's blocks of 16 among them) expand to exactly
those values, and Hetero's loader reads each into the weights that dequantization gives."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from hetero_core.model.gguf_checkpoint import reverse_permute
from hetero_core.model.gguf_codes import codes_of
from hetero_core.model.loader import load_model, read_checkpoint

DATA = Path(__file__).parents[1] / "data" / "gguf"
REFERENCE = json.loads((DATA / "llama_cpp_dequantized.json").read_text())
PURE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
MIXES = {"Q4_K_M": {"Q4_K", "Q6_K"}, "Q5_K_M": {"Q5_K", "Q6_K"}}  # the types each mix must hold
ALL = PURE + list(MIXES)


def reader(name: str) -> gguf.GGUFReader:
    return gguf.GGUFReader(str(DATA / f"tiny-{name}.gguf"))


def test_every_type_has_a_fixture_and_they_stay_small():
    files = sorted(DATA.glob("tiny-*.gguf"))
    assert sorted(f.name for f in files) == sorted(f"tiny-{n}.gguf" for n in ALL)
    assert sum(f.stat().st_size for f in files) < 8 * 2**20


@pytest.mark.parametrize("name", PURE)
def test_a_pure_fixture_holds_its_type_in_every_matrix(name):
    types = {t.name: t.tensor_type.name for t in reader(name).tensors}
    matrices = {n: t for n, t in types.items() if not n.endswith("norm.weight")}
    assert len(matrices) == 16 and set(matrices.values()) == {name}
    assert {t for n, t in types.items() if n.endswith("norm.weight")} == {"F32"}


@pytest.mark.parametrize("name", list(MIXES))
def test_a_k_mix_holds_llama_cpps_per_tensor_types(name):
    types = {t.name: t.tensor_type.name for t in reader(name).tensors}
    assert MIXES[name] <= set(types.values())
    assert types["output.weight"] == "Q6_K"  # the mixes keep the output at Q6_K
    assert types == {n: r["type"] for n, r in REFERENCE[name].items()}


@pytest.mark.parametrize("name", ALL)
def test_gguf_dequantizes_every_tensor_as_llama_cpp_does(name):
    tensors = reader(name).tensors
    assert {t.name for t in tensors} == set(REFERENCE[name])
    for tensor in tensors:
        expected = REFERENCE[name][tensor.name]
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float64).ravel()
        assert tensor.tensor_type.name == expected["type"] and values.size == expected["n"]
        assert np.isfinite(values).all()
        index, reference = np.array(expected["samples"]).T
        np.testing.assert_allclose(values[index.astype(int)], reference, rtol=1e-6, atol=1e-8)
        assert values.sum() == pytest.approx(expected["sum"], rel=1e-6, abs=1e-6)
        assert (values * values).sum() == pytest.approx(expected["sumsq"], rel=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_the_codes_of_every_matrix_expand_to_its_dequantized_values(name):
    matrices = [t for t in reader(name).tensors if t.data.ndim == 2 and t.tensor_type.name != "F32"]
    assert len(matrices) == 16
    for tensor in matrices:
        codes = codes_of(tensor.data, tensor.tensor_type.name)
        assert codes is not None, f"{tensor.name} ({tensor.tensor_type.name}) has no codes"
        assert codes.block == (16 if tensor.tensor_type.name == "Q6_K" else 32)
        reference = dequantize(tensor.data, tensor.tensor_type)
        np.testing.assert_array_equal(codes.values(), reference.reshape(codes.shape), err_msg=tensor.name)
        k_quant = tensor.tensor_type.name.endswith("_K")  # scales per super-block too, as stored
        assert (codes.base is not None) == k_quant, tensor.name
        if k_quant:
            scales = codes.base[..., None] * codes.factors.astype(np.float32)  # [N, S, n, blocks]
            np.testing.assert_array_equal(scales[..., 0, :].reshape(codes.d.shape), codes.d)
            if scales.shape[2] == 2:
                np.testing.assert_array_equal(scales[..., 1, :].reshape(codes.m.shape), codes.m)


@pytest.mark.parametrize("name", ALL)
def test_hetero_loads_each_fixture_into_the_dequantized_weights(name):
    config, state = read_checkpoint(DATA / f"tiny-{name}.gguf")
    assert config.num_hidden_layers == 2 and config.hidden_size == 256
    tensors = {t.name: dequantize(t.data, t.tensor_type) for t in reader(name).tensors}
    np.testing.assert_array_equal(state["model.embed_tokens.weight"].numpy(), tensors["token_embd.weight"])
    q = reverse_permute(tensors["blk.1.attn_q.weight"], config.num_attention_heads)
    np.testing.assert_array_equal(state["model.layers.1.self_attn.q_proj.weight"].numpy(), q)
    model = load_model(DATA / f"tiny-{name}.gguf")  # the module, its fused projections
    weights = model.state_dict()
    torch.testing.assert_close(weights["lm_head.weight"], torch.from_numpy(tensors["output.weight"]))
    qkv = np.concatenate(
        [
            reverse_permute(tensors["blk.0.attn_q.weight"], config.num_attention_heads),
            reverse_permute(tensors["blk.0.attn_k.weight"], config.num_key_value_heads),
            tensors["blk.0.attn_v.weight"],
        ]
    )
    torch.testing.assert_close(weights["model.layers.0.self_attn.qkv_proj.weight"], torch.from_numpy(qkv))
    down = torch.from_numpy(tensors["blk.0.ffn_down.weight"])
    torch.testing.assert_close(weights["model.layers.0.mlp.down_proj.weight"], down)
