"""Quantizing as the model loads, and the quantized model's prepared file: a model quantized layer by
layer (``int8_linear.Quantization`` as ``build_model``'s ``on_group``) holds exactly the codes,
scales and group sums of one quantized after a whole load; its prepared file, written as loading
streams, maps back to the same layers, with and without the compiled kernels, and the torch
executor's later start, mapping it, gives the first start's logits; a file written for one
quantization is never taken for another, nor for the unquantized model."""

from __future__ import annotations

import pytest
import torch

from hetero_core.cache import cache_file
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu.int8_linear import Int8Linear, Quantization, quantize_linears
from hetero_core.model.cpu.prepared_file import load_prepared
from hetero_core.model.cpu.prepared_weights import load_packed_model, prepared_path
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.loader import load_model
from tests.model.paged_batches import PagedSequence
from tests.model.test_batch_invariance import (
    BLOCK_SIZE,
    PROMPT,
    TOTAL,
    _assert_same,
    _prefill_then_decode,
    _Run,
    _tokens,
)


def _int8_layers(model) -> dict[str, Int8Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, Int8Linear)}


def _assert_same_layers(got, expected) -> None:
    got, expected = _int8_layers(got), _int8_layers(expected)
    assert got.keys() == expected.keys() and got
    for name, layer in got.items():
        want = expected[name]
        assert (layer.activations, layer.group_size) == (want.activations, want.group_size), name
        assert (layer.kernels is None) == (want.kernels is None), name
        stored, wanted = layer.stored_tensors(), want.stored_tensors()
        assert stored.keys() == wanted.keys(), name
        for suffix, tensor in stored.items():  # the same quantization of the same values: exactly equal
            assert torch.equal(tensor, wanted[suffix]), f"{name}{suffix}"


@pytest.fixture(params=["compiled", "torch"])
def kernels(request):
    if request.param == "torch":
        return None
    from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels

    try:
        return load_cpu_kernels(required=True)
    except KernelUnavailable as exc:
        pytest.skip(f"the CPU kernels cannot be built here: {exc}")


@pytest.mark.parametrize("method", ["int8", "w8a8"])
def test_quantizing_as_it_loads_matches_quantizing_the_loaded_model(tiny_model_dirs, kernels, method):
    model_dir, _ = tiny_model_dirs["llama"]
    whole = load_model(model_dir, dtype=torch.bfloat16)
    quantize_linears(whole, method, kernels, group_size=32)
    streamed = load_model(model_dir, dtype=torch.bfloat16, on_group=Quantization(method, 32, kernels))
    _assert_same_layers(streamed, whole)
    assert streamed.lm_head.activations == "float"  # W8A8 keeps the LM head weight-only


@pytest.mark.parametrize("method", ["int8", "w8a8"])
def test_the_quantized_prepared_file_maps_back_to_the_same_layers(
    tiny_model_dirs, prepared_cache_dir, kernels, method
):
    model_dir, _ = tiny_model_dirs["llama"]
    quantization = Quantization(method, 32, kernels)

    def load():
        return load_packed_model(
            model_dir,
            prepared_cache_dir.parent,
            backend=TorchPagedAttention(),
            dtype=torch.bfloat16,
            kernels=kernels,
            quantization=quantization,
        )

    first = load()
    path = prepared_path(model_dir, prepared_cache_dir.parent, torch.bfloat16, kernels, quantization)
    assert path.is_file() and f"-{method}-" in path.name
    second = load()
    _assert_same_layers(second, first)
    for name, tensor in second.state_dict().items():  # the norms and the embedding, as loaded
        assert torch.equal(tensor, first.state_dict()[name]), name
    other = Quantization("w8a8" if method == "int8" else "int8", 32, kernels)
    with pytest.raises(cache_file.CacheFileInvalid, match="quantization"):
        load_prepared(path, TorchPagedAttention(), kernels, other)
    with pytest.raises(cache_file.CacheFileInvalid, match="quantization"):
        load_prepared(path, TorchPagedAttention(), kernels)
    assert prepared_path(model_dir, prepared_cache_dir.parent, torch.bfloat16, kernels) != path


def test_quantization_group_size_changes_the_file(tiny_model_dirs, prepared_cache_dir):
    model_dir, _ = tiny_model_dirs["llama"]
    paths = {
        prepared_path(model_dir, prepared_cache_dir.parent, torch.bfloat16, None, Quantization("int8", size))
        for size in (0, 32, 64)
    }
    assert len(paths) == 3


def test_an_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="unknown quantization 'int4'; choices: int8, w8a8"):
        Quantization("int4")


@pytest.mark.parametrize("method", ["int8", "w8a8"])
def test_the_executor_maps_its_quantized_file_at_a_later_start(
    tiny_model_dirs, prepared_cache_dir, make_executor, cpu_kernels, method
):
    """The torch executor with ``quantization`` and the prepared cache on (the default): the first
    start writes the file, the second maps it, and both give the same logits (the same layers, the
    same kernels: the same sums in the same order)."""
    model_dir, _ = tiny_model_dirs["llama"]
    options = TorchExecutorOptions(dtype="bfloat16", quantization=method, amx_linears=False)
    runs = []
    for _ in range(2):
        executor = make_executor(model_dir, num_blocks=128, block_size=BLOCK_SIZE, options=options)
        assert executor.model.lm_head.float32_output and executor.model.lm_head.activations == "float"
        run = _Run(executor)
        _prefill_then_decode(run, PagedSequence(1, _tokens(TOTAL, seed=3), PROMPT), chunk=PROMPT)
        runs.append(run.logits[1])
    assert len(list(prepared_cache_dir.glob(f"*-{method}-*.safetensors"))) == 1
    _assert_same(runs[1], runs[0])
