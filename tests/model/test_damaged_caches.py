"""A damaged cache file is rebuilt with one warning: never fatal, never used, never a silent
permanent fallback. The compiled kernel library, the prepared weights and the converted GGUF model
here; the CPU dtype-speed record in test_compute_dtype.py. Every test has its own cache folder."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

from hetero_core.cache import cache_file
from hetero_core.default_plugins.torch_executor import TorchExecutorOptions
from hetero_core.errors import ModelLoadError
from hetero_core.model.cpu import prepared_weights
from hetero_core.model.cpu.linear import can_pack
from hetero_core.model.gguf_cache import ensure_gguf_converted
from hetero_core.model.loader import load_model
from tests.model.damaged_files import damage, invalid_cache_warnings, overwrite_tensors
from tests.model.paged_batches import prompt_logits
from tests.model.tiny_gguf import write_tiny_gguf

KERNEL_START = """
import torch
from hetero_core.model.cpu.kernels import load_cpu_kernels

kernels = load_cpu_kernels(required=True)
gate_up = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
expected = torch.nn.functional.silu(gate_up[:, :32]) * gate_up[:, 32:]
assert torch.allclose(kernels.silu_mul(gate_up), expected, rtol=1e-4, atol=1e-5)
print("kernels work:", kernels.path)
"""


def start_kernels(cache) -> subprocess.Popen:
    """A process that loads the kernels from ``cache`` and runs one (a crash there fails the test
    instead of killing pytest)."""
    env = {**os.environ, "HETERO_CACHE_DIR": str(cache)}
    return subprocess.Popen(
        [sys.executable, "-c", KERNEL_START],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finished(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=600)
    return process.returncode, out, err


@pytest.fixture(scope="module")
def built_kernels(tmp_path_factory):
    """A cache folder holding a freshly built kernel library."""
    cache = tmp_path_factory.mktemp("kernel-cache")
    code, out, err = finished(start_kernels(cache))
    if code != 0 and "KernelUnavailable" in err:
        pytest.skip(f"the CPU kernels cannot be built here: {err.strip().splitlines()[-1]}")
    assert code == 0, err
    return cache


def damaged_kernel_cache(built_kernels, tmp_path, how):
    cache = tmp_path / "cache"
    shutil.copytree(built_kernels, cache)
    [library] = (cache / "kernels").glob("*.so")
    damage(library, how)
    return cache, library


@pytest.mark.parametrize("how", ["truncated", "empty", "random"])
def test_a_damaged_kernel_library_is_rebuilt_before_it_is_loaded(built_kernels, tmp_path, how):
    """A truncated library used to kill every start with SIGBUS; an empty or random one made every
    start fall back to torch for good."""
    cache, library = damaged_kernel_cache(built_kernels, tmp_path, how)
    code, out, err = finished(start_kernels(cache))
    assert code == 0, err[-3000:]
    assert f"kernels work: {library}" in out
    [warning] = [line for line in err.splitlines() if "cache.file_invalid" in line]
    assert str(library) in warning and "rebuilding" in warning
    cache_file.map_checked(library)  # whole again


def test_two_starts_at_once_on_a_broken_library_both_get_working_kernels(built_kernels, tmp_path):
    cache, library = damaged_kernel_cache(built_kernels, tmp_path, "truncated")
    results = [finished(process) for process in [start_kernels(cache), start_kernels(cache)]]
    for code, out, err in results:
        assert code == 0 and "kernels work" in out, err[-3000:]
    cache_file.map_checked(library)
    assert [p.name for p in library.parent.iterdir()] == [library.name]  # no temporaries left


@pytest.mark.parametrize("how", ["random", "zeros", "truncated", "another model's"])
def test_a_damaged_prepared_file_is_rebuilt_and_the_answer_stays_right(
    tiny_model_dirs, make_executor, prepared_cache_dir, caplog, monkeypatch, how
):
    """Tensor bytes overwritten (the header intact, the size the same) used to be mapped and used:
    random bytes gave non-finite logits, zeros garbage text."""
    if not can_pack(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN does not pack float32 linears on this CPU")
    options = TorchExecutorOptions(dtype="float32")
    model_dir = tiny_model_dirs["llama"][0]
    expected = prompt_logits(
        make_executor(model_dir, options=options.model_copy(update={"prepared_weights_cache": False}))
    )
    make_executor(model_dir, options=options)
    [path] = prepared_cache_dir.glob("*.safetensors")
    if how == "truncated":
        damage(path, how)
    elif how == "another model's":
        make_executor(tiny_model_dirs["llama_bias"][0], options=options)
        [other] = [p for p in prepared_cache_dir.glob("*.safetensors") if p != path]
        shutil.copyfile(other, path)
    else:
        overwrite_tensors(path, how)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        again = make_executor(model_dir, options=options)
    assert torch.equal(prompt_logits(again), expected)
    [warning] = invalid_cache_warnings(caplog)
    assert str(path) in warning
    cache_file.map_checked(path)  # rebuilt whole: the next start maps it without the checkpoint

    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded although a whole prepared file exists")

    monkeypatch.setattr(prepared_weights, "load_model", refuse)
    assert torch.equal(prompt_logits(make_executor(model_dir, options=options)), expected)


@pytest.fixture
def tiny_gguf(tiny_model_dirs, tmp_path):
    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(tiny_model_dirs["llama"][1], path)
    return path


def converted(tiny_gguf, tmp_path):
    """The tiny GGUF converted into a cache, and its weights as loaded."""
    model_dir = ensure_gguf_converted(tiny_gguf, tmp_path / "cache")
    return model_dir, load_model(model_dir).state_dict()


def assert_same_weights(model_dir, expected):
    state = load_model(model_dir).state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[name], expected[name]) for name in state)


@pytest.mark.parametrize(
    "name, how",
    [
        ("config.json", "random"),
        ("config.json", "truncated"),
        ("generation_config.json", "zeros"),
        ("model.safetensors", "truncated"),
        (cache_file.MANIFEST, "flipped bit"),
    ],
)
def test_a_damaged_converted_model_is_converted_again_at_start(tiny_gguf, tmp_path, caplog, name, how):
    """A damaged config used to fail every start with a clear error and no way out but deleting it."""
    model_dir, expected = converted(tiny_gguf, tmp_path)
    damage(model_dir / name, how)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert ensure_gguf_converted(tiny_gguf, tmp_path / "cache") == model_dir
        assert_same_weights(model_dir, expected)
    [warning] = invalid_cache_warnings(caplog)
    assert name in warning and "rebuilding" in warning
    assert sorted(p.name for p in model_dir.parent.iterdir()) == [model_dir.name]  # the damaged copy is gone


def test_a_converted_model_without_a_manifest_is_converted_again(tiny_gguf, tmp_path, caplog):
    """Written by an older version: its files were never checked, so they are not trusted."""
    model_dir, expected = converted(tiny_gguf, tmp_path)
    (model_dir / cache_file.MANIFEST).unlink()
    with caplog.at_level(logging.WARNING, logger="hetero"):
        ensure_gguf_converted(tiny_gguf, tmp_path / "cache")
    [warning] = invalid_cache_warnings(caplog)
    assert "no hetero-manifest.json" in warning
    assert (model_dir / cache_file.MANIFEST).is_file()
    assert_same_weights(model_dir, expected)


@pytest.mark.parametrize("how", ["random", "zeros"])
def test_damaged_converted_weights_are_converted_again_before_they_are_read(tiny_gguf, tmp_path, caplog, how):
    """The weights are checked where they are read (a start that maps prepared weights never reads
    them), and converted again from the GGUF named in the manifest."""
    model_dir, expected = converted(tiny_gguf, tmp_path)
    overwrite_tensors(model_dir / "model.safetensors", how)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert ensure_gguf_converted(tiny_gguf, tmp_path / "cache") == model_dir  # sizes right: not read
        assert_same_weights(model_dir, expected)
    [warning] = invalid_cache_warnings(caplog)
    assert "model.safetensors" in warning


def test_damaged_converted_weights_whose_gguf_is_gone_name_the_fix(tiny_gguf, tmp_path):
    model_dir, _ = converted(tiny_gguf, tmp_path)
    overwrite_tensors(model_dir / "model.safetensors", "zeros")
    tiny_gguf.unlink()
    with pytest.raises(ModelLoadError, match=f"damaged .*delete {model_dir}"):
        load_model(model_dir)


CONVERT = """
import sys
from hetero_core.model.gguf_cache import ensure_gguf_converted
from hetero_core.model.loader import load_model
print(load_model(ensure_gguf_converted(sys.argv[1], sys.argv[2])).config.num_hidden_layers)
"""


def test_two_starts_at_once_on_a_damaged_conversion_both_get_a_whole_one(tiny_gguf, tmp_path):
    model_dir, expected = converted(tiny_gguf, tmp_path)
    damage(model_dir / "config.json", "random")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT, str(tiny_gguf), str(tmp_path / "cache")],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0 and out.strip().isdigit(), err[-3000:]
    assert_same_weights(model_dir, expected)
    assert sorted(p.name for p in model_dir.parent.iterdir()) == [model_dir.name]
