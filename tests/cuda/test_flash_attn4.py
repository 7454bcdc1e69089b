"""flash-attn-4 (``flash_attn.cute``) in the cuda executor, on its test double (CPU, fp32): the adapter
calls it the way flash-attn-4 takes a paged cache (keywords, ``page_table`` + ``seqused_k``, never
``cu_seqlens_k`` beside it), any block size runs, the loader finds flash-attn 2.x or 4, and the
compute-capability check. Where flash-attn-4 is installed, its real signature is checked too."""

from __future__ import annotations

import importlib.machinery
import inspect
import sys
import types

import pytest
import torch

from hetero_core import PluginError
from hetero_plugins_cuda.flash_attn4 import flash_attn4_kernels
from hetero_plugins_cuda.loader import load_flash_attn
from hetero_plugins_cuda.preflight import has_flash_attn
from tests.cuda.flash_attn4_double import FlashAttn4Double
from tests.cuda.flash_attn_double import FlashAttnDouble
from tests.cuda.step_plans import run_plan

H, HK, D = 4, 2, 16
KEYWORDS = (
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "seqused_k",
    "page_table",
    "softmax_scale",
    "causal",
)  # what the adapter passes flash-attn-4, all by keyword


@pytest.mark.parametrize("block_size", [16, 12])  # any page size: 12 is no power of two
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_every_step_path_on_flash_attn4_matches_the_torch_executor(
    block_size, cuda_graphs, tiny_dirs, make_cuda_executor, make_torch_executor
):
    model_dir, _ = tiny_dirs["qwen3"]
    double = FlashAttn4Double(dtypes=(torch.float32,))
    executor = make_cuda_executor(model_dir, double=double, block_size=block_size, cuda_graphs=cuda_graphs)
    assert executor.kernels.name == "flash-attn-4 test double (PyTorch)"
    got = run_plan(executor, block_size=block_size)
    expected = run_plan(make_torch_executor(model_dir, block_size=block_size), block_size=block_size)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and (g - e).abs().max() < 1e-4
    assert double.calls == {"varlen": 2, "varlen_paged": 2, "batched_paged": 2 * 5}  # as flash-attn 2.x's
    assert double.page_sizes == {block_size}


def test_the_double_refuses_what_flash_attn4_refuses():
    double = FlashAttn4Double()
    q = torch.zeros(3, H, D, dtype=torch.bfloat16)
    cache = torch.zeros(4, 8, HK, D, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    used = torch.ones(3, dtype=torch.int32)
    table = torch.zeros(3, 2, dtype=torch.int32)
    call = double.flash_attn_varlen_func
    with pytest.raises(AssertionError, match="page_table is not supported with cu_seqlens_k"):
        call(q, cache, cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_q, page_table=table)
    with pytest.raises(AssertionError, match="page_table must be int32"):
        call(q, cache, cache, cu_seqlens_q=cu_q, seqused_k=used, page_table=table.long())
    with pytest.raises(AssertionError, match="contiguous in the last dimension"):
        strided = torch.zeros(2, 3, dtype=torch.int32).t()
        call(q, cache, cache, cu_seqlens_q=cu_q, seqused_k=used, page_table=strided)
    with pytest.raises(AssertionError, match="int32"):
        call(q, cache, cache, cu_seqlens_q=cu_q, seqused_k=used.long(), page_table=table)
    with pytest.raises(AssertionError, match="inputs must be"):
        call(q.float(), cache.float(), cache.float(), cu_seqlens_q=cu_q, seqused_k=used, page_table=table)
    with pytest.raises(NotImplementedError, match="qv"):  # flash-attn 2.x's order: cu_seqlens_q lands in qv
        call(q, cache, cache, cu_q, cu_q, 1, 8)
    out, lse = call(q, cache, cache, cu_seqlens_q=cu_q, seqused_k=used, page_table=table, causal=True)
    assert out.shape == q.shape and lse is None and double.page_sizes == {8}


def test_flash_attn4_kernels_take_any_block_size_on_hopper_and_blackwell_only():
    kernels = flash_attn4_kernels(FlashAttn4Double().flash_attn_varlen_func, "4.0.0b36")
    assert kernels.name == "flash-attn-4 4.0.0b36" and kernels.fast_block_size == 128
    args = dict(dtype=torch.bfloat16, device=torch.device("cuda"), head_dim=128)
    for block_size in (1, 16, 128, 256):
        assert kernels.problems(block_size=block_size, capability=(9, 0), **args) == []
    assert kernels.problems(block_size=128, capability=(10, 0), **args) == []
    [reason] = kernels.problems(block_size=128, capability=(8, 0), **args)
    assert reason == (
        "executor.cuda.device 'cuda' has compute capability 8.0; flash-attn-4 4.0.0b36's paged "
        "KV cache runs on 9.x, 10.x, 11.x only; install flash-attn 2.x for this GPU"
    )
    assert (
        "float32 is not supported"
        in kernels.problems(block_size=128, capability=(9, 0), **{**args, "dtype": torch.float32})[0]
    )
    fa2 = FlashAttnDouble().kernels()
    assert fa2.problems(block_size=256, capability=(8, 0), **args) == []  # flash-attn 2.x: no capability list


def _module(name, **functions):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(functions)
    return module


def test_the_loader_takes_flash_attn2_first_then_flash_attn4(monkeypatch):
    fa2 = FlashAttnDouble()
    fa4 = FlashAttn4Double()
    fa2_module = _module(
        "flash_attn",
        __version__="2.8.3",
        flash_attn_varlen_func=fa2.flash_attn_varlen_func,
        flash_attn_with_kvcache=fa2.flash_attn_with_kvcache,
    )
    monkeypatch.setitem(sys.modules, "flash_attn", fa2_module)
    monkeypatch.setitem(
        sys.modules,
        "flash_attn.cute",
        _module("flash_attn.cute", flash_attn_varlen_func=fa4.flash_attn_varlen_func),
    )
    kernels = load_flash_attn()
    assert kernels.name == "flash-attn 2.8.3" and kernels.page_block_multiple == 256 and has_flash_attn()
    monkeypatch.setitem(sys.modules, "flash_attn", _module("flash_attn"))  # flash-attn-4 alone: a namespace
    kernels = load_flash_attn()
    assert kernels.name.startswith("flash-attn-4 ") and kernels.page_block_multiple == 1 and has_flash_attn()
    q = torch.zeros(2, 1, H, D, dtype=torch.bfloat16)
    cache = torch.zeros(3, 5, HK, D, dtype=torch.bfloat16)
    lengths, table = torch.ones(2, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)
    out = kernels.with_kvcache(
        q, cache, cache, cache_seqlens=lengths, block_table=table, softmax_scale=0.5, causal=True
    )
    assert out.shape == q.shape and fa4.calls == {"batched_paged": 1}


def test_the_loader_names_both_packages_when_neither_imports(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn raises ImportError
    with pytest.raises(PluginError, match="needs flash-attn 2.x or flash-attn-4: .*flash-attn-4\\[cu13\\]"):
        load_flash_attn()
    assert not has_flash_attn()


def test_the_adapter_matches_the_installed_flash_attn4_signature():
    """On a machine with flash-attn-4 (the GPU check's): every keyword the adapter passes exists, and
    the double's signature agrees with the real one on them."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError as exc:
        pytest.skip(f"flash-attn-4 is not installed here ({exc})")
    real = inspect.signature(flash_attn_varlen_func).parameters
    double = inspect.signature(FlashAttn4Double().flash_attn_varlen_func).parameters
    assert list(real)[:4] == list(double)[:4] == ["q", "k", "v", "qv"]
    for name in KEYWORDS:
        assert name in real and real[name].default == double[name].default, name
