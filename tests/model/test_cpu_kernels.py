"""The compiled CPU kernels (K/V write, decode and prefill attention): same answers as the torch
path, their build cache, and what happens where no C compiler works."""

from __future__ import annotations

import pytest
import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.errors import ConfigError
from hetero_core.model.attention import KVCache
from hetero_core.model.cpu import kernel_attention
from hetero_core.model.cpu import kernels as cpu_kernels_module
from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from tests.model.kernel_builds import NARROW_BUILDS, kernels_for
from tests.model.paged_batches import BlockPool, PagedSequence, step

CPU = torch.device("cpu")


@pytest.fixture
def kernel(cpu_kernels):
    return cpu_kernels


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """A machine without a working C compiler and with an empty kernel cache."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    cpu_kernels_module._load.cache_clear()
    yield
    cpu_kernels_module._load.cache_clear()


def _decode_step(lengths, num_kv_heads, group_size, head_dim, block_size, dtype, seed=0):
    """Sequences of ``lengths`` tokens decoding together over shuffled blocks filled with random K/V."""
    torch.manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lengths) + 4
    pool = BlockPool(num_blocks, shuffle=True, seed=seed)
    seqs = [PagedSequence(i, list(range(n)), n - 1) for i, n in enumerate(lengths)]
    step([(s, n - 1) for s, n in zip(seqs, lengths, strict=True) if n > 1], pool, block_size)
    batch = step([(s, 1) for s in seqs], pool, block_size)
    cache = KVCache(
        *(torch.randn(num_kv_heads, num_blocks, block_size, head_dim).to(dtype) for _ in range(2))
    )
    # query rows strided as in the model (q is a slice of the fused q/k/v projection's output)
    fused = torch.randn(len(lengths), num_kv_heads * (group_size + 2), head_dim).to(dtype)
    return batch, cache, fused[:, : num_kv_heads * group_size]


def _both_paths(kernel, batch, cache, query):
    with_kernel, plain = TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()
    metadata = plain.build_metadata(batch, CPU)
    outs = [
        backend._attend_decode(query, cache, metadata.decode, 0.125, backend._kernels_for(query, cache))
        for backend in (with_kernel, plain)
    ]
    return outs[0], outs[1].to(outs[0].dtype)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    "num_kv_heads, group_size, head_dim, block_size",
    [
        (3, 3, 64, 16),  # SmolLM2-135M
        (2, 4, 128, 16),
        (4, 1, 32, 8),  # no grouping
        (1, 7, 64, 1),  # MQA, one token per block
    ],
)
def test_kernel_matches_the_torch_path(
    kernel, dtype, tolerance, num_kv_heads, group_size, head_dim, block_size
):
    lengths = [1, 2, block_size, block_size + 1, 3 * block_size, 97, 300]
    batch, cache, query = _decode_step(lengths, num_kv_heads, group_size, head_dim, block_size, dtype)
    out, expected = _both_paths(kernel, batch, cache, query)
    assert out.shape == query.shape and out.dtype == dtype and out.is_contiguous()
    assert (out.float() - expected.float()).abs().max().item() < tolerance


def test_a_non_finite_query_spoils_only_its_own_head(kernel):
    batch, cache, query = _decode_step([5, 40, 17], 3, 3, 64, 16, torch.float32)
    query = query.clone()
    query[1, 0, 0] = float("nan")
    out, expected = _both_paths(kernel, batch, cache, query)
    assert out[1, 0].isnan().all() and expected[1, 0].isnan().all()
    out[1, 0], expected[1, 0] = 0.0, 0.0  # every other head, of this sequence too, is untouched
    assert (out - expected).abs().max().item() < 1e-5


def test_mixed_steps_use_the_kernel_for_their_decodes(kernel):
    """A step with a prefill among decodes: the decodes and the prefill (both attended by the
    kernels) match the pure-torch backend."""
    pool = BlockPool(64)
    decoding = [PagedSequence(i, list(range(n)), n - 1) for i, n in enumerate([9, 33, 70])]
    step([(s, len(s.token_ids) - 1) for s in decoding], pool, 16)
    fresh = PagedSequence(9, list(range(25)), 25)
    batch = step([(decoding[0], 1), (fresh, 25), (decoding[1], 1), (decoding[2], 1)], pool, 16)
    torch.manual_seed(1)
    shapes = [(batch.num_tokens, 9, 64), (batch.num_tokens, 3, 64), (batch.num_tokens, 3, 64)]
    query, key, value = (torch.randn(shape) for shape in shapes)
    outs = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = backend.allocate_kv_cache(1, 64, 16, 3, 64, torch.float32, CPU)[0]
        torch.manual_seed(2)
        cache.key.copy_(torch.randn(cache.key.shape))
        cache.value.copy_(torch.randn(cache.value.shape))
        outs.append(
            backend.forward(query, key, value, cache, backend.build_metadata(batch, CPU), scale=0.125)
        )
    assert (outs[0] - outs[1]).abs().max().item() < 1e-5


def _forward_both(kernel, batch, num_blocks, num_kv_heads, group_size, head_dim, block_size, dtype, seed=0):
    """``batch`` through the kernels' backend and the pure-torch one, over the same random cache
    contents (the cached prefixes) and step K/V: (outputs, caches) of each."""
    torch.manual_seed(seed)
    num_heads = num_kv_heads * group_size
    # q/k/v as the model hands them: slices of one fused projection output (strided rows)
    fused = torch.randn(batch.num_tokens, num_heads + 2 * num_kv_heads, head_dim).to(dtype)
    query, key, value = fused.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    contents = [torch.randn(num_kv_heads, num_blocks, block_size, head_dim).to(dtype) for _ in range(2)]
    results = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = KVCache(*(tensor.clone() for tensor in contents))
        out = backend.forward(
            query, key, value, cache, backend.build_metadata(batch, CPU), scale=head_dim**-0.5
        )
        results.append((out, cache))
    return results


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    "num_kv_heads, group_size, head_dim, block_size",
    [
        (3, 3, 64, 16),  # SmolLM2-135M
        (2, 4, 128, 16),
        (4, 1, 40, 8),  # no grouping; a head size that is not a multiple of 16
        (1, 7, 64, 1),  # MQA, one token per block
    ],
)
def test_prefill_kernel_matches_the_torch_path(
    kernel, dtype, tolerance, num_kv_heads, group_size, head_dim, block_size
):
    """Fresh prompts of many lengths (one token short of, at and past the kernel's 16-token tiles and
    64-key chunks) and prompts continuing a cached prefix, in one step over shuffled blocks."""
    num_blocks = 720  # block_size 1 needs one per token
    pool = BlockPool(num_blocks, shuffle=True, seed=3)
    fresh = [PagedSequence(i, list(range(n)), n) for i, n in enumerate([2, 15, 16, 17, 63, 64, 65, 130])]
    continued = [PagedSequence(10 + i, list(range(n)), n) for i, n in enumerate([40, 100, 200])]
    step([(seq, cached) for seq, cached in zip(continued, [1, 37, 128], strict=True)], pool, block_size)
    batch = step([(seq, seq.num_remaining) for seq in [*fresh, *continued]], pool, block_size)
    (out, cache), (expected, expected_cache) = _forward_both(
        kernel, batch, num_blocks, num_kv_heads, group_size, head_dim, block_size, dtype
    )
    assert out.shape == expected.shape and out.dtype == dtype
    assert (out.float() - expected.float()).abs().max().item() < tolerance
    assert torch.equal(cache.key, expected_cache.key) and torch.equal(cache.value, expected_cache.value)


def test_a_non_finite_prefill_query_spoils_only_its_own_row_and_head(kernel):
    pool = BlockPool(64)
    seqs = [PagedSequence(i, list(range(n)), n) for i, n in enumerate([20, 30])]
    batch = step([(seq, seq.num_remaining) for seq in seqs], pool, 16)
    torch.manual_seed(0)
    query, key, value = torch.randn(50, 9, 64), torch.randn(50, 3, 64), torch.randn(50, 3, 64)
    query[25, 4, 0] = float("nan")  # the second sequence's 6th token, head 4
    outs = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = backend.allocate_kv_cache(1, 64, 16, 3, 64, torch.float32, CPU)[0]
        outs.append(
            backend.forward(query, key, value, cache, backend.build_metadata(batch, CPU), scale=0.125)
        )
    out, expected = outs
    assert out[25, 4].isnan().all()
    out[25, 4], expected[25, 4] = 0.0, 0.0
    assert not out.isnan().any() and (out - expected).abs().max().item() < 1e-5


def test_the_kv_write_refuses_a_slot_outside_the_cache_and_writes_nothing(kernel):
    key_cache, value_cache = torch.zeros(2, 4, 8, 16), torch.zeros(2, 4, 8, 16)
    key, value = torch.ones(3, 2, 16), torch.ones(3, 2, 16)
    with pytest.raises(ValueError, match="outside the cache"):
        kernel.write_kv(key, value, key_cache, value_cache, torch.tensor([0, 5, 32]))
    assert not key_cache.any() and not value_cache.any()
    kernel.write_kv(key, 2 * value, key_cache, value_cache, torch.tensor([0, 9, 31]))
    written = key_cache.view(2, 32, 16)
    assert written[:, [0, 9, 31]].eq(1).all() and written.sum() == 3 * 2 * 16
    assert value_cache.view(2, 32, 16)[:, [0, 9, 31]].eq(2).all()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("same_strides", [True, False])
def test_a_decode_step_writes_its_kv_and_attends_in_one_call(kernel, dtype, tolerance, same_strides):
    """A pure decode step goes through one kernel call that writes the new K/V rows and attends;
    K and V may come with different token strides (K rotated into its own tensor, V a slice of
    the projection), as the model hands them when RoPE runs in torch."""
    pool = BlockPool(64, shuffle=True, seed=1)
    seqs = [PagedSequence(i, list(range(n)), n - 1) for i, n in enumerate([5, 38, 21, 70])]
    step([(seq, len(seq.token_ids) - 1) for seq in seqs], pool, 4)
    batch = step([(seq, 1) for seq in seqs], pool, 4)
    torch.manual_seed(0)
    fused = torch.randn(4, 3 * 3 + 2 * 3, 64).to(dtype)
    query, key, value = fused.split([9, 3, 3], dim=1)
    if not same_strides:
        key = key.clone()
    contents = [torch.randn(3, 64, 4, 64).to(dtype) for _ in range(2)]
    results = []
    for backend in (TorchPagedAttention(cpu_kernels=kernel), TorchPagedAttention()):
        cache = KVCache(*(tensor.clone() for tensor in contents))
        results.append(
            (backend.forward(query, key, value, cache, backend.build_metadata(batch, CPU), 0.125), cache)
        )
    (out, cache), (expected, expected_cache) = results
    assert (out.float() - expected.float()).abs().max().item() < tolerance
    assert torch.equal(cache.key, expected_cache.key) and torch.equal(cache.value, expected_cache.value)


def test_sizes_beyond_the_kernels_limits_take_the_torch_path(kernel):
    query = torch.randn(2, 4, kernel_attention.MAX_HEAD_DIM + 8)
    assert not kernel.supports(query, num_kv_heads=2)
    assert not kernel.supports(torch.randn(2, 4, 64).half(), num_kv_heads=2)
    assert kernel.supports(torch.randn(2, 4, 64), num_kv_heads=2)


def _recording_compiler(tmp_path, body: str) -> tuple[str, object]:
    """A ``$CC`` that appends its arguments to a log, then runs ``body`` (sh)."""
    log = tmp_path / "cc.log"
    script = tmp_path / "cc"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{body}\n')
    script.chmod(0o755)
    return str(script), log


def test_the_library_is_built_once_into_the_cache(kernel, monkeypatch, tmp_path):
    """Each source compiles in its own compiler process (at once, as many as there are cores), then
    one link; a second load finds the library and starts no process."""
    import shutil

    compiler, calls = _recording_compiler(tmp_path, f'exec {shutil.which("cc") or shutil.which("gcc")} "$@"')
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    cpu_kernels_module._load.cache_clear()
    try:
        built = load_cpu_kernels(required=True).path
        assert built.parent == tmp_path / "cache" / "kernels" and built.is_file()
        lines = calls.read_text().splitlines()
        compiled = sorted(line.split()[-1].rsplit("/", 1)[-1] for line in lines if " -c " in line)
        assert compiled == sorted(cpu_kernels_module.SOURCES)
        [link] = [line for line in lines if " -c " not in line]
        assert "-shared" in link.split() and link.count(".o") == len(cpu_kernels_module.SOURCES)
        stamp = built.stat().st_mtime_ns
        cpu_kernels_module._load.cache_clear()

        def no_process(*args, **kwargs):
            raise AssertionError(f"a cached library started a process: {args}")

        with monkeypatch.context() as patch:  # a cached library costs no compiler run (not even --version)
            patch.setattr(cpu_kernels_module.subprocess, "run", no_process)
            assert load_cpu_kernels(required=True).path == built and built.stat().st_mtime_ns == stamp
        assert [p.name for p in built.parent.iterdir()] == [built.name]  # no temporaries left
    finally:
        cpu_kernels_module._load.cache_clear()


def test_the_settings_cache_dir_holds_the_kernels(kernel, tmp_path, tiny_model_dirs):
    """``cache_dir`` (``--cache-dir``) is where a process's kernels are built and found at their first
    load, as its converted models and prepared weights are (a copy of this machine's library: found,
    not built)."""
    import shutil
    from pathlib import Path

    from hetero_core.default_plugins.torch_executor import TorchExecutor
    from hetero_core.executor import ExecutorContext
    from hetero_core.settings import HeteroSettings

    (tmp_path / "kernels").mkdir()
    shutil.copy(kernel.path, tmp_path / "kernels" / kernel.path.name)
    model_dir, _ = tiny_model_dirs["llama"]
    ctx = ExecutorContext(
        settings=HeteroSettings(cache_dir=tmp_path),
        options=TorchExecutorOptions(cpu_kernels="compiled", prepared_weights_cache=False, dtype="float32"),
        model_dir=Path(model_dir),
        num_blocks=16,
        block_size=16,
        max_model_len=256,
        max_num_batched_tokens=256,
        max_num_seqs=4,
        eos_token_id=None,
        vocab_size=0,
    )
    cpu_kernels_module._load.cache_clear()  # a process keeps the first library it loads
    try:
        executor = TorchExecutor(ctx)
        assert executor.backend.cpu_kernels.path == tmp_path / "kernels" / kernel.path.name
    finally:
        cpu_kernels_module._load.cache_clear()


def test_a_source_that_does_not_compile_names_the_compilers_error(monkeypatch, tmp_path):
    compiler, _ = _recording_compiler(
        tmp_path,
        'case "$*" in *q8a_coded_linear.c*) echo "q8a_coded_linear.c:1: error: boom" >&2; exit 1;; esac\n'
        'while [ "$1" != "-o" ]; do shift; done; touch "$2"',  # every other step "succeeds"
    )
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    cpu_kernels_module._load.cache_clear()
    try:
        with pytest.raises(KernelUnavailable, match="could not build the CPU kernels: .*error: boom"):
            load_cpu_kernels(required=True)
        assert not list((tmp_path / "cache" / "kernels").glob("*.so"))  # nothing half-built is kept
    finally:
        cpu_kernels_module._load.cache_clear()


def test_without_a_compiler_auto_falls_back_and_kernel_is_refused(
    no_compiler, tiny_model_dirs, make_executor
):
    assert load_cpu_kernels() is None
    with pytest.raises(KernelUnavailable, match="C compiler"):
        load_cpu_kernels(required=True)
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=TorchExecutorOptions(cpu_kernels="auto"))
    assert executor.backend.cpu_kernels is None
    with pytest.raises(ConfigError, match='cpu_kernels = "compiled".*C compiler'):
        make_executor(model_dir, options=TorchExecutorOptions(cpu_kernels="compiled"))


def test_the_option_chooses_the_path(kernel, tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["llama"]
    assert (
        make_executor(model_dir, options=TorchExecutorOptions(cpu_kernels="torch")).backend.cpu_kernels
        is None
    )
    chosen = make_executor(
        model_dir, options=TorchExecutorOptions(cpu_kernels="compiled")
    ).backend.cpu_kernels
    assert chosen is not None and chosen.path == kernel.path
    assert make_executor(model_dir).backend.cpu_kernels.path == kernel.path  # auto, where it builds


@pytest.mark.parametrize("cpu_kernels", ["torch", "compiled"])
def test_greedy_tokens_do_not_depend_on_the_kernels(cpu_kernels, tiny_model_dirs, kernel):
    """A tiny Llama through the whole engine: the same greedy tokens with or without the kernels (in
    fp32 both: ``auto`` may time bf16 weights where only the kernels run them)."""
    from hetero_core import LLM, SamplingParams

    model_dir, _ = tiny_model_dirs["llama"]
    prompts = [[5, 9, 2, 7], list(range(3, 40)), [11] * 20]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    runs = []
    for path in ("torch", cpu_kernels):
        llm = LLM(
            model=str(model_dir),
            executor={"name": "torch", "torch": {"cpu_kernels": path, "dtype": "float32"}},
            tokenizer="byte",
            block_size=4,
            max_num_blocks=64,
        )
        runs.append([out.output_token_ids for out in llm.generate(prompts, params)])
        llm.shutdown()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, 3, 200])  # 200 x 576: enough rows to split over threads
def test_the_element_wise_kernels_match_the_torch_layers(kernel, dtype, tolerance, rows):
    """RMSNorm (alone and fused with the residual add), SiLU-and-multiply and RoPE in place against
    the layers' torch code on the same inputs."""
    from hetero_core.model.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary

    torch.manual_seed(rows)
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data.uniform_(0.5, 1.5)
    x, residual = (torch.randn(rows, 576).to(dtype) for _ in range(2))
    expected = norm(x)
    expected_sum_norm, expected_sum = norm(x, residual.clone())
    norm.kernels = kernel

    def close(got, want):
        return (got.float() - want.float()).abs().max().item() < tolerance * max(1, want.abs().max())

    assert close(norm(x), expected)
    fused_residual = residual.clone()
    got_norm, got_sum = norm(x, fused_residual)
    assert got_sum is fused_residual and close(got_sum, expected_sum) and close(got_norm, expected_sum_norm)

    mlp = SwiGLU(576, 1536, bias=False).to(dtype)
    gate_up = 4 * torch.randn(rows, 3072).to(dtype)  # large |x| too: silu's exp must not overflow
    gate, up = gate_up.chunk(2, dim=-1)
    assert close(kernel.silu_mul(gate_up), torch.nn.functional.silu(gate) * up)
    mlp.kernels = kernel
    assert mlp(x).shape == (rows, 576)

    rotary = RotaryEmbedding(64, 10000.0, None)
    cos, sin = rotary.cos_sin(torch.arange(rows) * 7, dtype)
    qkv = torch.randn(rows, 15, 64).to(dtype)  # 9 query + 3 key heads rotated, 3 value heads not
    expected_qk = apply_rotary(qkv[:, :12], cos, sin)
    values = qkv[:, 12:].clone()
    kernel.rotary_(qkv[:, :12], cos, sin)
    assert close(qkv[:, :12], expected_qk) and torch.equal(qkv[:, 12:], values)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("width", [1, 7, 40])  # no whole vector, a partial one, a whole one and a part
def test_the_element_wise_kernels_take_any_width(kernel, dtype, tolerance, width):
    """Rows narrower than a vector, or with a tail, go through the same vector code (vload_part)."""
    from hetero_core.model.layers import RMSNorm, apply_rotary

    torch.manual_seed(width)
    norm = RMSNorm(width, 1e-6).to(dtype)
    x, residual = torch.randn(5, width).to(dtype), torch.randn(5, width).to(dtype)
    expected, (expected_sum_norm, expected_sum) = norm(x), norm(x, residual.clone())
    norm.kernels = kernel
    assert kernel.handles(x, width) and not kernel.handles(x.half(), width) and not kernel.handles(x, 0)

    def close(got, want):
        return (got.float() - want.float()).abs().max().item() < tolerance * max(1, want.abs().max())

    fused_residual = residual.clone()
    got_norm, got_sum = norm(x, fused_residual)
    assert close(norm(x), expected) and close(got_sum, expected_sum) and close(got_norm, expected_sum_norm)
    gate_up = 4 * torch.randn(5, 2 * width).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert close(kernel.silu_mul(gate_up), torch.nn.functional.silu(gate) * up)
    cos, sin = torch.randn(5, 1, width).to(dtype), torch.randn(5, 1, width).to(dtype)
    qkv = torch.randn(5, 3, 2 * width).to(dtype)
    expected_q = apply_rotary(qkv[:, :2], cos, sin)
    kernel.rotary_(qkv[:, :2], cos, sin)
    assert close(qkv[:, :2], expected_q)


@pytest.mark.parametrize("build", NARROW_BUILDS)  # SSE (4 lanes), AVX (8, no AVX2 or FMA), AVX2
def test_kernels_built_for_narrower_vectors_agree(build, tmp_path_factory):
    """The kernels pick their vector width from the ISA they are compiled for; built here for a
    baseline x86, for AVX without AVX2 and for AVX2 (machines without AVX-512 get these), they give
    the same answers (their linears: test_cpu_kernel_linears.py)."""
    narrow = kernels_for(build, tmp_path_factory.getbasetemp() / "kernel_builds")
    assert not narrow.bf16_linear_native and narrow.fuses_swiglu(torch.bfloat16)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        pool = BlockPool(128, shuffle=True, seed=2)
        fresh = [PagedSequence(i, list(range(n)), n) for i, n in enumerate([3, 17, 70])]
        continued = [PagedSequence(5, list(range(90)), 90)]
        step([(continued[0], 33)], pool, 16)
        batch = step([(seq, seq.num_remaining) for seq in [*fresh, *continued]], pool, 16)
        (out, _), (expected, _) = _forward_both(narrow, batch, 128, 3, 3, 64, 16, dtype)
        assert (out.float() - expected.float()).abs().max().item() < tolerance
        decode_batch, cache, query = _decode_step([1, 16, 17, 97], 2, 4, 128, 16, dtype)
        out, expected = _both_paths(narrow, decode_batch, cache, query)
        assert (out.float() - expected.float()).abs().max().item() < tolerance
        test_the_element_wise_kernels_match_the_torch_layers(narrow, dtype, tolerance, 200)
        test_the_element_wise_kernels_take_any_width(narrow, dtype, tolerance, 7)
