"""``dtype = "auto"`` that fits and costs little: candidates whose weights do not fit in memory are
never loaded, and the others are timed on models of the checkpoint's first layers, extrapolated to
all of them. Memory and timings are injected: nothing here depends on this machine's."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from hetero_core.default_plugins import torch_memory
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.errors import ConfigError, ModelLoadError
from hetero_core.model.cpu import dtype_choice, dtype_probe, probe_model
from hetero_core.model.cpu.dtype_choice import StepTimes
from hetero_core.model.cpu.linear import PackedLinear
from hetero_core.model.cpu.memory_budget import MemoryBudget
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.cpu.weight_size import checkpoint_tensors
from tests.model.tiny_models import _COMMON, random_hf_model

AUTO = TorchExecutorOptions(dtype="auto", cpu_kernels="compiled")
NUM_LAYERS = 7


@pytest.fixture(scope="module")
def seven_layers(tmp_path_factory):
    """A tiny Llama of ``NUM_LAYERS`` layers (more than the probe's 3) with its HF model."""
    directory = tmp_path_factory.mktemp("seven_layers")
    model = random_hf_model(transformers.LlamaConfig(**{**_COMMON, "num_hidden_layers": NUM_LAYERS}))
    model.save_pretrained(directory, safe_serialization=True)
    return directory, model


def test_extrapolation_is_the_line_through_the_two_layer_counts():
    assert probe_model.extrapolate({1: 0.3, 3: 0.7}, 30) == pytest.approx(0.3 + 0.2 * 29)
    assert probe_model.extrapolate({3: 0.7, 1: 0.3}, 3) == pytest.approx(0.7)
    assert probe_model.extrapolate({1: 0.5, 3: 0.4}, 30) == 0.5  # noise: no negative per-layer time
    assert probe_model.extrapolate({2: 0.4}, 2) == 0.4
    assert probe_model.probe_layers(30) == probe_model.PROBE_LAYERS == (1, 3)
    assert probe_model.probe_layers(3) == (3,) and probe_model.probe_layers(2) == (2,)


def test_the_first_layers_model_holds_the_checkpoints_first_layers(seven_layers):
    directory, hf_model = seven_layers
    model = probe_model.first_layers(directory, 3, backend=TorchPagedAttention(), dtype=torch.float32)
    assert model.config.num_hidden_layers == 3 and len(model.model.layers) == 3
    state = model.state_dict()
    assert not any(".layers.3." in name for name in state)
    expected = hf_model.model.layers[2].mlp.down_proj.weight
    assert torch.equal(state["model.layers.2.mlp.down_proj.weight"], expected)
    assert torch.equal(state["model.embed_tokens.weight"], hf_model.model.embed_tokens.weight)


class LayerCountProbe:
    """Step times that grow with the runner's layers: ``base`` + ``per_layer`` x layers, per candidate."""

    def __init__(self) -> None:
        self.runs = []  # (dtype, layers) of every runner timed
        self.ceilings = False  # True: ``Outpaced`` above a ceiling, as the real probe

    def time_steps(self, runner, ceiling_s=None) -> StepTimes:
        layers = len(runner.model.model.layers)
        self.runs.append((str(runner.dtype).removeprefix("torch."), layers))
        scale = 1.0 if runner.dtype == torch.bfloat16 else 2.0  # bf16 twice as fast
        times = StepTimes(*(scale * (0.01 + 0.002 * layers) * f for f in (10, 2, 1)))
        if self.ceilings and ceiling_s is not None and times.workload_s() > ceiling_s:
            raise dtype_choice.Outpaced(times)
        return times


@pytest.fixture
def layer_probe(monkeypatch):
    probe = LayerCountProbe()
    monkeypatch.setattr(dtype_probe, "time_steps", probe.time_steps)
    return probe


def fake_memory(monkeypatch, available_bytes: int) -> None:
    budget = MemoryBudget(available_bytes, "a fake cgroup's memory.max minus usage")
    monkeypatch.setattr(torch_memory, "memory_budget", lambda: budget)


@pytest.mark.parametrize("cpu_flag_set", ["avx512_bf16"], indirect=True)
def test_candidates_are_timed_on_one_and_three_layers_and_extrapolated(
    cpu_flag_set, layer_probe, seven_layers, make_executor, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="hetero"):
        executor = make_executor(seven_layers[0], options=AUTO)
    assert sorted(layer_probe.runs) == [("bfloat16", 1), ("bfloat16", 3), ("float32", 1), ("float32", 3)]
    assert executor.dtype == torch.bfloat16 and len(executor.model.model.layers) == NUM_LAYERS
    [line] = [r.getMessage() for r in caplog.records if "executor.dtype " in r.getMessage() + " "]
    # bf16's single decode on 7 layers: 0.01 + 0.002 x 7 = 24 ms, float32's twice that
    assert "decode 1 seq 24.0 ms" in line and "decode 1 seq 48.0 ms" in line
    assert "first 1 and 3 of 7 layers" in line and "2.00x" in line


@pytest.mark.parametrize("cpu_flag_set", ["avx512_bf16"], indirect=True)
def test_a_candidate_outpaced_on_its_larger_probe_model_is_timed_no_further_and_estimated(
    cpu_flag_set, layer_probe, seven_layers, make_executor, tmp_path, monkeypatch, caplog
):
    """fp32 (2x slower) is timed after bf16: its 3-layer round is 2x bf16's (above LOSING), so its
    1-layer model is never built and its whole model's times are its 3-layer ones scaled as bf16's."""
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    layer_probe.ceilings = True
    with caplog.at_level(logging.INFO, logger="hetero"):
        executor = make_executor(seven_layers[0], options=AUTO)
    assert layer_probe.runs == [("bfloat16", 3), ("bfloat16", 1), ("float32", 3)]
    assert executor.dtype == torch.bfloat16
    [line] = [r.getMessage() for r in caplog.records if "executor.dtype " in r.getMessage() + " "]
    assert "float32 (outpaced: estimated from one round)" in line
    assert "decode 1 seq 24.0 ms" in line and "decode 1 seq 48.0 ms" in line  # exact: the same scale
    assert "2.00x float32's speed (estimated)" in line


@pytest.mark.parametrize("cpu_flag_set", ["avx512_bf16"], indirect=True)
def test_a_candidate_whose_weights_do_not_fit_is_never_loaded(
    cpu_flag_set, layer_probe, seven_layers, make_executor, tmp_path, monkeypatch, caplog
):
    """fp32 needs more than the (fake) memory, bf16 fits: bf16 unmeasured, fp32 never built."""
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    fit = torch_memory.memory_fit(_ctx(seven_layers[0]), AUTO, None)
    between = (fit.needed_bytes("bfloat16") + fit.needed_bytes("float32")) // 2
    fake_memory(monkeypatch, between)
    with caplog.at_level(logging.INFO, logger="hetero"):
        executor = make_executor(seven_layers[0], options=AUTO)
    assert executor.dtype == torch.bfloat16 and layer_probe.runs == []
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "executor.dtype_candidate_skipped" in messages and "candidate=float32" in messages
    assert "skipped: float32: its weights" in messages and "fake cgroup" in messages


@pytest.mark.parametrize("cpu_flag_set", ["avx2", "avx512"], indirect=True)
def test_without_native_bf16_bf16_weights_run_on_the_kernels_where_fp32_does_not_fit(
    cpu_flag_set, layer_probe, seven_layers, make_executor, tmp_path, monkeypatch, caplog
):
    """No native bf16 (AVX2, AVX-512 without bf16): fp32 alone where it fits; where it does not, the
    kernels' bf16 linears (weights widened to fp32) run the bf16 weights, unmeasured; torch alone has
    no bf16 worth running there, so none fits."""
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    assert make_executor(seven_layers[0], options=AUTO).dtype == torch.float32 and layer_probe.runs == []
    fit = torch_memory.memory_fit(_ctx(seven_layers[0]), AUTO, None)
    fake_memory(monkeypatch, (fit.needed_bytes("bfloat16") + fit.needed_bytes("float32")) // 2)
    with caplog.at_level(logging.INFO, logger="hetero"):
        executor = make_executor(seven_layers[0], options=AUTO)
    assert executor.dtype == torch.bfloat16 and layer_probe.runs == []
    assert any(isinstance(m, PackedLinear) for m in executor.model.modules())  # the kernels' bf16 linears
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "skipped: float32: its weights" in messages
    with pytest.raises(ConfigError, match="bfloat16|dtype"):
        make_executor(seven_layers[0], options=TorchExecutorOptions(dtype="auto", cpu_kernels="torch"))


@pytest.mark.parametrize("cpu_flag_set", ["avx512_bf16"], indirect=True)
def test_a_model_that_fits_in_no_candidate_is_a_clear_error(
    cpu_flag_set, layer_probe, seven_layers, make_executor, tmp_path, monkeypatch
):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    fake_memory(monkeypatch, 1 << 20)
    with pytest.raises(ConfigError) as error:
        make_executor(seven_layers[0], options=AUTO)
    message = str(error.value)
    parts = ("does not fit in memory", "in float32", "in bfloat16", "1 MiB available", "--quantization int8")
    assert all(part in message for part in parts), message
    assert layer_probe.runs == []


def test_the_weight_estimate_counts_every_parameter_and_an_untied_head(seven_layers, tiny_model_dirs):
    directory, hf_model = seven_layers
    tensors = checkpoint_tensors(directory)
    num_params = sum(p.numel() for p in hf_model.parameters())
    assert tensors.num_parameters == num_params and not tensors.tied_embeddings
    assert tensors.resident_bytes("float32") == 4 * num_params
    assert tensors.resident_bytes("bfloat16") == 2 * num_params


def _ctx(model_dir):
    from hetero_core.executor import ExecutorContext

    return ExecutorContext(
        settings=None,
        options=None,
        model_dir=model_dir,
        num_blocks=64,
        block_size=16,
        max_model_len=4096,
        max_num_batched_tokens=4096,
        max_num_seqs=16,
        eos_token_id=None,
        vocab_size=0,
    )


def test_the_gguf_header_reader_matches_gguf_readers_tensor_infos(tiny_model_dirs, tmp_path):
    """The header is stepped over without the gguf package (whose reader parses every field), to the
    same tensors, element counts and types; a Q4_1 tensor counts at its packed code size in fp32
    (code_panels' f16-scale layout: 16 bytes of codes and f16 d and m per 32 weights)."""
    import gguf

    from hetero_core.model.cpu.weight_size import CheckpointTensors, gguf_tensor_infos
    from tests.model.tiny_gguf import write_tiny_gguf

    hf_model = tiny_model_dirs["llama"][1]
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(hf_model, path)
    expected = [(t.name, int(t.n_elements), int(t.tensor_type)) for t in gguf.GGUFReader(str(path)).tensors]
    assert gguf_tensor_infos(path) == expected
    tensors = checkpoint_tensors(path)
    assert tensors.num_parameters == sum(p.numel() for p in hf_model.parameters())
    assert set(tensors.code_types.values()) == {"F32"}
    coded = CheckpointTensors({"model.layers.0.mlp.up_proj.weight": 3200}, False, None)
    object.__setattr__(coded, "code_types", {"model.layers.0.mlp.up_proj.weight": "Q4_1"})
    assert coded.resident_bytes("float32", block_codes=True) == 3200 * 20 // 32
    assert coded.resident_bytes("float32") == 4 * 3200 and coded.resident_bytes("bfloat16") == 2 * 3200
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(ModelLoadError, match="cannot read the GGUF header"):
        gguf_tensor_infos(tmp_path / "bad.gguf")


def test_an_explicit_dtype_that_does_not_fit_is_loaded_with_a_warning(
    seven_layers, make_executor, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    fake_memory(monkeypatch, 1 << 20)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        executor = make_executor(seven_layers[0], options=TorchExecutorOptions(dtype="float32"))
    assert executor.dtype == torch.float32
    [warning] = [r.getMessage() for r in caplog.records if "executor.memory_tight" in r.getMessage()]
    assert "do not fit in 1 MiB available" in warning


def test_real_probe_steps_run_on_the_first_layers_and_their_view(
    seven_layers, make_executor, tmp_path, monkeypatch, caplog
):
    """No fake timings: two fp32 candidates (the kernels' and torch's path) timed for real on the 3-layer
    model and its 1-layer view (packed, fused decode), extrapolated to positive figures."""
    from hetero_core.default_plugins import torch_auto_dtype

    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dtype_probe, "REPEATS", 1)
    candidates = lambda kernels, amx=True, widened_bf16=False: {  # noqa: E731
        "float32": (torch.float32, kernels),
        "float32-torch": (torch.float32, None),
    }
    monkeypatch.setattr(torch_auto_dtype, "auto_candidates", candidates)
    built = []
    original = probe_model.fewer_layers
    monkeypatch.setattr(probe_model, "fewer_layers", lambda m, n: built.append(n) or original(m, n))
    with caplog.at_level(logging.INFO, logger="hetero"):
        executor = make_executor(seven_layers[0], options=AUTO)
    assert executor.dtype == torch.float32 and built == [1, 1]
    [line] = [r.getMessage() for r in caplog.records if "executor.dtype " in r.getMessage() + " "]
    assert "first 1 and 3 of 7 layers" in line and "float32-torch: prefill 128 tokens" in line
