"""``gguf_codes``: every GGUF type it keeps as codes expands (``d * q + m`` in fp32) to exactly the
values of gguf's own ``dequantize``: blocks quantized by gguf where it can (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0; llama.cpp's own blocks of every type: ``test_gguf_fixtures``), and random raw blocks (any
bytes are a valid block; the f16 scales made finite) for every type, Q6_K's in blocks of 16 inputs."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from hetero_core.model.gguf_codes import codes_of, has_codes
from tests.model.gguf_files import F16_OFFSETS

CODE_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 8, "Q5_1": 8, "Q8_0": 8, "Q4_K": 4, "Q5_K": 8, "Q6_K": 8}
BLOCKS = {"Q6_K": 16}  # inputs per code block where not 32
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
ROWS, COLUMNS = 48, 512


def assert_same_values(codes, reference: np.ndarray) -> None:
    """Equal as fp32 values, and bit for bit but for the sign of zeros (see ``gguf_codes``)."""
    ours = codes.values()
    assert ours.dtype == np.float32 and ours.shape == reference.shape
    np.testing.assert_array_equal(ours, reference)
    nonzero = reference != 0
    assert np.array_equal(ours.view(np.uint32)[nonzero], reference.view(np.uint32)[nonzero])


def random_blocks(type_name: str, rng: np.random.Generator) -> np.ndarray:
    """[ROWS, row bytes] random bytes, with the f16 scales random finite values (normals, subnormals,
    negatives and zeros among them)."""
    qtype = GGMLQuantizationType[type_name]
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(ROWS, COLUMNS // block, size), dtype=np.uint8)
    for offset in F16_OFFSETS[type_name]:
        scales = rng.standard_normal((ROWS, COLUMNS // block)) * 10.0 ** rng.integers(-7, 3, (ROWS, 1))
        scales[rng.random(scales.shape) < 0.02] = 0
        raw[..., offset : offset + 2] = scales.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(ROWS, -1)


@pytest.mark.parametrize("type_name", QUANTIZABLE)
def test_codes_of_gguf_quantized_weights_expand_to_its_dequantized_values(type_name):
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((ROWS, COLUMNS)) * 0.05).astype(np.float32)
    weights[:, :32] = 0  # a block of zeros (d = 0)
    raw = quantize(weights, GGMLQuantizationType[type_name])
    codes = codes_of(raw, type_name)
    assert codes.bits == CODE_TYPES[type_name] and codes.shape == (ROWS, COLUMNS)
    assert_same_values(codes, dequantize(raw, GGMLQuantizationType[type_name]))


@pytest.mark.parametrize("type_name", sorted(CODE_TYPES))
def test_codes_of_random_raw_blocks_expand_to_their_dequantized_values(type_name):
    raw = random_blocks(type_name, np.random.default_rng(1))
    codes = codes_of(raw, type_name)
    block = BLOCKS.get(type_name, 32)
    assert codes.block == block and codes.d.shape == codes.m.shape == (ROWS, COLUMNS // block)
    assert codes.q.shape == (ROWS, COLUMNS // block, block)
    assert codes.q.dtype == (np.uint8 if codes.bits == 4 else np.int8)
    assert_same_values(codes, dequantize(raw, GGMLQuantizationType[type_name]))
    assert_same_values(codes.widened(), dequantize(raw, GGMLQuantizationType[type_name]))


def test_code_ranges_are_the_types_own():
    rng = np.random.default_rng(2)
    ranges = {name: codes_of(random_blocks(name, rng), name).q for name in CODE_TYPES}
    assert (ranges["Q4_0"].min(), ranges["Q4_0"].max()) == (0, 15)
    assert (ranges["Q4_K"].min(), ranges["Q4_K"].max()) == (0, 15)
    assert (ranges["Q5_0"].min(), ranges["Q5_0"].max()) == (-16, 15)
    assert (ranges["Q5_1"].min(), ranges["Q5_1"].max()) == (0, 31)
    assert (ranges["Q5_K"].min(), ranges["Q5_K"].max()) == (0, 31)
    assert (ranges["Q8_0"].min(), ranges["Q8_0"].max()) == (-128, 127)
    assert (ranges["Q6_K"].min(), ranges["Q6_K"].max()) == (-32, 31)


@pytest.mark.parametrize("type_name", ["Q2_K", "Q3_K", "IQ4_XS", "F16", "F32", "BF16"])
def test_types_without_codes_are_none(type_name):
    assert not has_codes(type_name)
    assert codes_of(np.zeros((1, 210), dtype=np.uint8), type_name) is None


def test_a_row_of_partial_blocks_is_refused():
    with pytest.raises(ValueError, match="not whole blocks of 20"):
        codes_of(np.zeros((2, 30), dtype=np.uint8), "Q4_1")
