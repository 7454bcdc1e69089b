"""The prepared-weights cache: the CPU executor's converted, fused and packed weights saved once and
memory-mapped at later starts, with the same logits as converting and packing afresh."""

from __future__ import annotations

import os

import pytest
import torch

from hetero_core.default_plugins.torch_executor import TorchExecutorOptions
from hetero_core.model.cpu import prepared_weights
from hetero_core.model.cpu.linear import PackedLinear, can_pack
from tests.model.paged_batches import prompt_logits

CPU = torch.device("cpu")


def prepared_files(folder):
    return sorted(folder.glob("*.safetensors")) if folder.exists() else []


def options(dtype: str, cpu_kernels: str = "auto", **more) -> TorchExecutorOptions:
    if not can_pack(CPU, getattr(torch, dtype)):
        pytest.skip(f"oneDNN does not pack {dtype} linears on this CPU")
    return TorchExecutorOptions(dtype=dtype, cpu_kernels=cpu_kernels, **more)


def forbid_checkpoint_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded although a prepared file exists")

    monkeypatch.setattr(prepared_weights, "load_model", refuse)


@pytest.mark.parametrize("model", ["llama", "llama_mqa_tied", "llama_bias", "qwen3"])
@pytest.mark.parametrize(
    "dtype, cpu_kernels", [("float32", "auto"), ("bfloat16", "auto"), ("bfloat16", "torch")]
)
def test_a_prepared_start_gives_the_same_logits_without_loading_the_checkpoint(
    tiny_model_dirs, make_executor, prepared_cache_dir, monkeypatch, model, dtype, cpu_kernels
):
    model_dir, _ = tiny_model_dirs[model]
    fresh = make_executor(model_dir, options=options(dtype, cpu_kernels, prepared_weights_cache=False))
    expected = prompt_logits(fresh)
    assert prepared_files(prepared_cache_dir) == []  # the option off writes nothing

    first = make_executor(model_dir, options=options(dtype, cpu_kernels))
    assert len(prepared_files(prepared_cache_dir)) == 1
    assert torch.equal(prompt_logits(first), expected)

    forbid_checkpoint_loading(monkeypatch)
    second = make_executor(model_dir, options=options(dtype, cpu_kernels))
    assert torch.equal(prompt_logits(second), expected)
    linears = [m for m in second.model.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the LM head
    assert second.model.lm_head.float32_output


@pytest.mark.parametrize("dtype, layout", [("bfloat16", "bf16"), ("float32", "f32")])
def test_layers_no_kernel_layout_takes_are_stored_plain_and_packed_again(
    tiny_model_dirs, make_executor, prepared_cache_dir, monkeypatch, cpu_kernels, dtype, layout
):
    pack = "pack_bf16_linear" if layout == "bf16" else "pack_f32_linear"
    original = getattr(type(cpu_kernels), pack)
    monkeypatch.setattr(
        type(cpu_kernels),
        pack,  # the down projections (96 inputs) stay with oneDNN
        lambda self, weight, swiglu=False: None if weight.shape[1] == 96 else original(self, weight, swiglu),
    )
    model_dir, _ = tiny_model_dirs["llama"]
    expected = prompt_logits(make_executor(model_dir, options=options(dtype, prepared_weights_cache=False)))
    make_executor(model_dir, options=options(dtype))
    forbid_checkpoint_loading(monkeypatch)
    second = make_executor(model_dir, options=options(dtype))
    down = second.model.model.layers[0].mlp.down_proj
    assert not down.all_rows and down.packed_weight is not None and down.kernel_dtype is None
    gate_up = second.model.model.layers[0].mlp.gate_up_proj
    assert gate_up.all_rows and gate_up.kernel_dtype == layout
    assert torch.equal(prompt_logits(second), expected)


def test_an_unreadable_prepared_file_is_replaced(tiny_model_dirs, make_executor, prepared_cache_dir):
    model_dir, _ = tiny_model_dirs["qwen2"]
    expected = prompt_logits(make_executor(model_dir, options=options("float32")))
    [path] = prepared_files(prepared_cache_dir)
    path.write_bytes(b"not a safetensors file")
    again = make_executor(model_dir, options=options("float32"))
    assert torch.equal(prompt_logits(again), expected)
    assert path.stat().st_size > 1000  # written again, whole


def test_a_changed_checkpoint_or_dtype_gets_its_own_file(tiny_model_dirs, prepared_cache_dir, tmp_path):
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dirs["llama"][0], model_dir)
    before = prepared_weights.prepared_path(model_dir, prepared_cache_dir.parent, torch.float32)
    assert before == prepared_weights.prepared_path(model_dir, prepared_cache_dir.parent, torch.float32)
    assert before != prepared_weights.prepared_path(model_dir, prepared_cache_dir.parent, torch.bfloat16)
    weights = model_dir / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert before != prepared_weights.prepared_path(model_dir, prepared_cache_dir.parent, torch.float32)


def test_only_the_most_recently_used_files_are_kept(tiny_model_dirs, make_executor, prepared_cache_dir):
    prepared_cache_dir.mkdir(parents=True)
    for i in range(prepared_weights.KEEP_FILES + 2):
        old = prepared_cache_dir / f"old-{i}.safetensors"
        old.write_bytes(b"x")
        os.utime(old, (1000 + i, 1000 + i))
    stale_tmp = prepared_cache_dir / ".old.safetensors.123.tmp"
    stale_tmp.write_bytes(b"x")
    os.utime(stale_tmp, (1000, 1000))
    make_executor(tiny_model_dirs["llama"][0], options=options("float32"))
    kept = [p.name for p in prepared_files(prepared_cache_dir)]
    newest = [f"old-{i}.safetensors" for i in range(prepared_weights.KEEP_FILES + 1, 2, -1)]
    assert len(kept) == prepared_weights.KEEP_FILES and set(newest) < set(kept)
    assert not stale_tmp.exists()


def test_small_checkpoints_get_no_file(tiny_model_dirs, make_executor, tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    make_executor(tiny_model_dirs["llama"][0], options=options("float32"))
    assert not (tmp_path / "cache" / "prepared").exists()


def test_an_unwritable_cache_costs_only_the_file(tiny_model_dirs, make_executor, prepared_cache_dir):
    prepared_cache_dir.parent.mkdir(parents=True)
    prepared_cache_dir.write_text("a file where the folder should be")
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=options("float32"))
    assert prompt_logits(executor).shape[0] == 1
