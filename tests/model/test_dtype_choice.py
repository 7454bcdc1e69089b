"""``dtype = "auto"`` on the CPU: the faster candidate on timed steps of the model, cached per CPU, model
and version; the figures in one log line. Timings are injected: nothing here measures a duration."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from hetero_core.cache import cache_file
from hetero_core.default_plugins import torch_auto_dtype
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu import dtype_choice, dtype_probe
from hetero_core.model.cpu.dtype_choice import StepTimes
from hetero_core.model.cpu.kernels import load_cpu_kernels
from tests.model.damaged_files import DAMAGE, damage, invalid_cache_warnings

FAST, SLOW = StepTimes(0.1, 0.02, 0.01), StepTimes(0.2, 0.04, 0.02)


def test_the_faster_candidate_on_the_reference_workload_wins():
    assert dtype_choice.decide({"float32": SLOW, "bfloat16": FAST})[0] == "bfloat16"
    assert dtype_choice.decide({"float32": FAST, "bfloat16": SLOW})[0] == "float32"  # the Xeon without AMX
    three = {"float32": SLOW, "bfloat16": StepTimes(0.15, 0.03, 0.015), "bfloat16-amx": FAST}
    assert dtype_choice.decide(three)[0] == "bfloat16-amx"


def test_a_candidate_never_wins_where_its_own_figures_are_slower():
    """bf16's prefill faster but its decodes slower, so its reference workload is slower: fp32."""
    prefill_only = StepTimes(0.05, 0.06, 0.03)
    assert prefill_only.workload_s() > SLOW.workload_s() * 0.5
    name, reason = dtype_choice.decide({"float32": FAST, "bfloat16": prefill_only})
    assert name == "float32" and "faster than" in reason


def test_float32_keeps_a_tie_within_the_margin():
    almost = StepTimes(FAST.prefill_s / 1.02, FAST.decode_s / 1.02, FAST.single_s / 1.02)
    name, reason = dtype_choice.decide({"float32": FAST, "bfloat16": almost})
    assert name == "float32" and "tie margin" in reason
    clear = StepTimes(FAST.prefill_s / 1.1, FAST.decode_s / 1.1, FAST.single_s / 1.1)
    assert dtype_choice.decide({"float32": FAST, "bfloat16": clear})[0] == "bfloat16"


def test_the_reason_gives_every_candidates_figures():
    _, reason = dtype_choice.decide({"float32": SLOW, "bfloat16": FAST})
    assert "2.00x float32's speed" in reason
    for figure in ("prefill 128 tokens 200.0 ms", "decode 32 seqs 40.0 ms", "decode 1 seq 10.0 ms"):
        assert figure in reason


@pytest.mark.parametrize(
    "bad", [StepTimes(0.0, 0.1, 0.1), StepTimes(float("nan"), 0.1, 0.1), StepTimes(0.1, float("inf"), 0.1)]
)
def test_times_that_are_not_positive_numbers_are_refused(bad):
    with pytest.raises(ValueError, match="positive finite"):
        dtype_choice.decide({"float32": FAST, "bfloat16": bad})


def _measure(times: dict[str, StepTimes], calls: list[str]):
    def measure(name: str, rival: str | None = None) -> StepTimes:
        calls.append(name)
        return times[name]

    return measure


def test_the_choice_is_measured_once_and_then_read_from_the_cache(tmp_path):
    calls = []
    measure = _measure({"float32": SLOW, "bfloat16": FAST}, calls)
    first = dtype_choice.choose(["float32", "bfloat16"], measure, "cpu | model", tmp_path)
    again = dtype_choice.choose(["float32", "bfloat16"], measure, "cpu | model", tmp_path)
    assert first.name == again.name == "bfloat16" and not first.cached and again.cached
    assert calls == ["float32", "bfloat16"]
    assert "earlier start" in again.reason and again.times == first.times
    dtype_choice.choose(["float32", "bfloat16"], measure, "cpu | another model", tmp_path)
    assert len(calls) == 4  # another key: measured; both records kept
    assert len(json.loads(cache_file.read_checked(tmp_path / dtype_choice.CACHE_FILE))) == 2


def test_one_candidate_is_never_measured(tmp_path):
    choice = dtype_choice.choose(["float32"], lambda name: pytest.fail("measured"), "key", tmp_path)
    assert choice.name == "float32" and not (tmp_path / dtype_choice.CACHE_FILE).exists()


def test_a_record_of_other_candidates_is_measured_again(tmp_path):
    """An AMX machine whose kernels now pass their self-check has a third candidate."""
    calls = []
    dtype_choice.choose(
        ["float32", "bfloat16"], _measure({"float32": SLOW, "bfloat16": FAST}, calls), "k", tmp_path
    )
    three = {"float32": SLOW, "bfloat16": FAST, "bfloat16-amx": StepTimes(0.05, 0.01, 0.005)}
    assert dtype_choice.choose(list(three), _measure(three, calls), "k", tmp_path).name == "bfloat16-amx"
    assert len(calls) == 5


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_cache_is_measured_again_with_one_warning(how, tmp_path, caplog):
    calls = []
    measure = _measure({"float32": SLOW, "bfloat16": FAST}, calls)
    dtype_choice.choose(["float32", "bfloat16"], measure, "k", tmp_path)
    damage(tmp_path / dtype_choice.CACHE_FILE, how)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert dtype_choice.choose(["float32", "bfloat16"], measure, "k", tmp_path).name == "bfloat16"
        assert dtype_choice.choose(["float32", "bfloat16"], measure, "k", tmp_path).cached  # rewritten whole
    assert len(invalid_cache_warnings(caplog)) == 1 and len(calls) == 4


@pytest.mark.parametrize(
    "record",
    [
        {"times": {"float32": [1, 2, 3], "bfloat16": [0, 1, 1]}},
        {"times": "fast"},
        {"choice": "bfloat16"},
        [1, 2],
        {"times": {"float32": [1, 2], "bfloat16": [1, 2]}},
    ],
)
def test_a_checksummed_but_unusable_record_is_measured_again(record, tmp_path, caplog):
    cache_file.write_checked(
        tmp_path / dtype_choice.CACHE_FILE, json.dumps({"k": record, "other": {}}).encode()
    )
    calls = []
    with caplog.at_level(logging.WARNING, logger="hetero"):
        choice = dtype_choice.choose(
            ["float32", "bfloat16"], _measure({"float32": SLOW, "bfloat16": FAST}, calls), "k", tmp_path
        )
    assert choice.name == "bfloat16" and len(calls) == 2
    [warning] = invalid_cache_warnings(caplog)
    assert "unusable" in warning
    assert sorted(json.loads(cache_file.read_checked(tmp_path / dtype_choice.CACHE_FILE))) == ["k", "other"]


def test_an_unwritable_cache_still_answers(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    choice = dtype_choice.choose(
        ["float32", "bfloat16"], _measure({"float32": SLOW, "bfloat16": FAST}, []), "k", blocker / "cache"
    )
    assert choice.name == "bfloat16"


def test_the_probe_steps_are_a_prefill_a_batched_decode_and_a_single_decode():
    prefill = dtype_probe.prefill_batch(2)
    assert prefill.num_tokens == dtype_choice.PREFILL_TOKENS and all(prefill.is_prefill)
    decode = dtype_probe.decode_batch(dtype_choice.DECODE_SEQS)
    assert decode.num_tokens == dtype_choice.DECODE_SEQS and not any(decode.is_prefill)
    assert decode.context_lens == [dtype_choice.CONTEXT + 1] * dtype_choice.DECODE_SEQS
    slots = [s for b in (prefill, decode) for s in b.slot_mapping]
    assert max(slots) < dtype_probe.num_blocks() * dtype_probe.BLOCK_SIZE
    assert len(set(decode.slot_mapping)) == len(decode.slot_mapping)  # every sequence its own blocks


def test_a_candidate_outpaced_by_the_fastest_so_far_is_recorded_as_an_estimate(tmp_path):
    """``measure`` gets the fastest candidate measured so far as its rival; a candidate it stops
    (``Outpaced``) loses with its figures marked as estimates, here and from the record."""
    fast, slow = StepTimes(0.05, 0.01, 0.005), StepTimes(0.2, 0.04, 0.02)
    rivals = []

    def measure(name, rival=None):
        rivals.append(rival)
        if name == "bfloat16-amx":
            return fast
        raise dtype_choice.Outpaced(slow)

    order = ["bfloat16-amx", "bfloat16", "float32"]
    first = dtype_choice.choose(order, measure, "k", tmp_path)
    assert first.name == "bfloat16-amx" and rivals == [None, "bfloat16-amx", "bfloat16-amx"]
    assert "4.00x float32's speed (estimated)" in first.reason
    assert "float32 (outpaced: estimated from one round)" in first.reason
    again = dtype_choice.choose(order, measure, "k", tmp_path)
    assert again.cached and again.name == "bfloat16-amx" and len(rivals) == 3
    assert "4.00x bfloat16's speed (estimated)" in again.reason


def test_a_step_round_above_the_ceiling_stops_the_timing(monkeypatch):
    runner = ClockedRunner(2.0)
    monkeypatch.setattr(dtype_probe.time, "perf_counter", lambda: runner.now)
    with pytest.raises(dtype_choice.Outpaced) as stop:
        dtype_probe.time_steps(runner, ceiling_s=1.0)
    assert runner.runs.count("prefill") == 2  # the warm-up and one timed round
    assert stop.value.times.prefill_s == pytest.approx(1.0)
    runner = ClockedRunner(2.0)
    monkeypatch.setattr(dtype_probe.time, "perf_counter", lambda: runner.now)
    assert dtype_probe.time_steps(runner, ceiling_s=1e6).prefill_s == pytest.approx(1.0)


class ClockedRunner:
    """A runner whose steps take the fake clock's seconds: a prefill ``prefill_s``, a decode 0.01 s plus
    0.001 s a sequence; a step gets faster each time it runs (its first run is the slowest)."""

    def __init__(self, prefill_s: float):
        self.now, self.prefill_s, self.runs = 0.0, prefill_s, []
        self.kv_caches = []

    def execute(self, batch):
        kind = "prefill" if any(batch.is_prefill) else f"decode {len(batch.seq_ids)}"
        self.runs.append(kind)
        took = self.prefill_s if kind == "prefill" else 0.01 + 0.001 * len(batch.seq_ids)
        self.now += took / self.runs.count(kind)


@pytest.mark.parametrize("prefill_s", [0.01, 2.0])
def test_a_long_step_is_timed_once_after_its_warm_up_and_a_short_one_best_of_repeats(prefill_s, monkeypatch):
    runner = ClockedRunner(prefill_s)
    monkeypatch.setattr(dtype_probe.time, "perf_counter", lambda: runner.now)
    times = dtype_probe.time_steps(runner)
    repeats = dtype_choice.REPEATS
    prefill_runs = 2 if prefill_s > dtype_probe.STEP_BUDGET_S else repeats + 1
    assert runner.runs.count("prefill") == prefill_runs
    assert runner.runs.count("decode 1") == repeats + 1  # 11 ms steps: the best of every repeat
    assert times.prefill_s == pytest.approx(prefill_s / prefill_runs)  # the best: the last, fastest run
    assert times.single_s == pytest.approx(0.011 / (repeats + 1))


# The candidates each CPU flag set offers (tests/conftest.py's CPU_FLAG_SETS): bf16 where the CPU computes it
# natively, bf16 on AMX tiles (emulated here) beside it where it has AMX
CANDIDATES = {
    "amx": ["float32", "bfloat16", "bfloat16-amx"],
    "avx512_bf16": ["float32", "bfloat16"],
    "avx512": ["float32"],
    "avx2": ["float32"],
}


AUTO = TorchExecutorOptions(dtype="auto", cpu_kernels="compiled")


def candidate_of(runner) -> str:
    """The auto candidate ``runner`` is: its dtype, and whether its kernels are the AMX variant."""
    kernels = runner.backend.cpu_kernels
    amx = kernels is not None and kernels.amx
    return "bfloat16-amx" if amx else str(runner.dtype).removeprefix("torch.")


class FakeProbe:
    """Step times by the candidate of the runner the executor built (no timing); every run recorded."""

    def __init__(self) -> None:
        self.faster, self.runs, self.outpaced = "float32", [], []

    def time_steps(self, runner, ceiling_s=None) -> StepTimes:
        """As the real probe: ``Outpaced`` where the times are above ``ceiling_s``."""
        self.runs.append(candidate_of(runner))
        times = FAST if self.runs[-1] == self.faster else SLOW
        if ceiling_s is not None and times.workload_s() > ceiling_s:
            self.outpaced.append(self.runs[-1])
            raise dtype_choice.Outpaced(times)
        return times


@pytest.fixture
def fake_probe(monkeypatch):
    probe = FakeProbe()
    monkeypatch.setattr(dtype_probe, "time_steps", probe.time_steps)
    return probe


def test_every_cpu_flag_set_has_its_candidates(cpu_flag_set):
    """The guard that no test here depends on this machine's CPU: each flag set's candidates are its own."""
    kernels = load_cpu_kernels()
    candidates = torch_auto_dtype.auto_candidates(kernels)
    expected = CANDIDATES[cpu_flag_set] if kernels is not None else CANDIDATES[cpu_flag_set][:2]
    assert list(candidates) == expected
    without_amx = [c for c in expected if "amx" not in c]
    assert list(torch_auto_dtype.auto_candidates(kernels, amx=False)) == without_amx


@pytest.mark.parametrize(
    "cpu_flag_set, faster",
    [(flags, c) for flags, cs in CANDIDATES.items() for c in cs],
    indirect=["cpu_flag_set"],
)
def test_an_auto_executor_runs_the_candidate_its_probe_found_faster_and_says_why(
    cpu_flag_set, faster, fake_probe, tiny_model_dirs, make_executor, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    candidates = CANDIDATES[cpu_flag_set]
    fake_probe.faster = faster
    model_dir, _ = tiny_model_dirs["llama"]
    with caplog.at_level(logging.INFO, logger="hetero"):
        executor = make_executor(model_dir, options=AUTO)
    expected_dtype = torch.float32 if faster == "float32" else torch.bfloat16
    assert executor.dtype == expected_dtype and executor.kv_caches[0].key.dtype == expected_dtype
    assert candidate_of(executor.runner) == faster
    [line] = [r.getMessage() for r in caplog.records if "executor.dtype" in r.getMessage()]
    assert "requested=auto" in line.replace("'", "")
    if len(candidates) == 1:
        assert fake_probe.runs == [] and "only candidate" in line
        return
    assert fake_probe.runs == candidates[::-1]  # each candidate timed once, the likeliest fastest first
    # SLOW is 2x FAST: a slow candidate timed after the fast one is outpaced (LOSING 1.5), not timed whole
    assert fake_probe.outpaced == candidates[::-1][candidates[::-1].index(faster) + 1 :]
    assert "reference workload" in line and "2.00x" in line
    assert all(f"{c} (outpaced: estimated from one round)" in line for c in fake_probe.outpaced)
    make_executor(model_dir, options=AUTO)
    assert len(fake_probe.runs) == len(candidates)  # the second start read the record


@pytest.mark.parametrize("cpu_flag_set", ["amx", "avx512_bf16"], indirect=True)
def test_an_explicit_dtype_is_never_probed(
    cpu_flag_set, fake_probe, tiny_model_dirs, make_executor, tmp_path, monkeypatch
):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    executor = make_executor(tiny_model_dirs["llama"][0], options=TorchExecutorOptions(dtype="bfloat16"))
    assert executor.dtype == torch.bfloat16 and fake_probe.runs == []


@pytest.mark.parametrize("cpu_flag_set", ["avx512", "avx2"], indirect=True)
def test_without_native_bf16_auto_is_float32_unmeasured(
    cpu_flag_set, fake_probe, tiny_model_dirs, make_executor, tmp_path, monkeypatch
):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    executor = make_executor(tiny_model_dirs["llama"][0], options=TorchExecutorOptions(dtype="auto"))
    assert executor.dtype == torch.float32 and fake_probe.runs == []


@pytest.mark.parametrize("cpu_flag_set", ["avx512_bf16"], indirect=True)
def test_the_probe_hands_its_freed_memory_back(
    cpu_flag_set, fake_probe, tiny_model_dirs, make_executor, tmp_path, monkeypatch
):
    """The candidates' freed weights must not stay resident in glibc's heap (malloc_trim after the probe)."""
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(torch_auto_dtype, "release_freed_memory", lambda: calls.append(1) or True)
    make_executor(tiny_model_dirs["llama"][0], options=TorchExecutorOptions(dtype="auto"))
    assert calls == [1]
    make_executor(tiny_model_dirs["llama"][0], options=TorchExecutorOptions(dtype="auto"))
    assert calls == [1]  # read from the record: nothing loaded, nothing to hand back


def test_handing_freed_memory_back_runs_anywhere():
    assert torch_auto_dtype.release_freed_memory() in (True, False)  # False where the C library is not glibc


def test_a_record_of_more_candidates_answers_for_the_ones_that_fit_now(tmp_path):
    """Measured with three candidates; a later start where bf16-amx does not fit in memory reads the
    record for the two left, measuring nothing."""
    three = {"float32": SLOW, "bfloat16": FAST, "bfloat16-amx": StepTimes(0.05, 0.01, 0.005)}
    calls = []
    assert dtype_choice.choose(list(three), _measure(three, calls), "k", tmp_path).name == "bfloat16-amx"
    two = dtype_choice.choose(["float32", "bfloat16"], _measure(three, calls), "k", tmp_path)
    assert two.name == "bfloat16" and two.cached and len(calls) == 3
    assert set(two.times) == {"float32", "bfloat16"}


@pytest.mark.parametrize("cpu_flag_set", ["amx", "avx512_bf16"], indirect=True)
@pytest.mark.parametrize("activations", ["float", "int8"])
def test_a_gguf_on_float_code_activations_is_float32_unmeasured(
    cpu_flag_set, activations, fake_probe, make_executor, tmp_path, monkeypatch, caplog
):
    """A GGUF's linears are codes: on float activations they compute in fp32 whatever the dtype, and
    bf16 would lose the fused decode, so ``auto`` is float32 untimed; int8 activations are timed."""
    from hetero_core.model.gguf_cache import ensure_gguf_converted
    from tests.model.test_gguf_fixtures import DATA

    if load_cpu_kernels() is None:
        pytest.skip("the CPU kernels cannot be built here (no codes without them)")
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    folder = ensure_gguf_converted(DATA / "tiny-Q4_K_M.gguf", tmp_path / "cache")
    options = TorchExecutorOptions(dtype="auto", code_activations=activations)
    if activations == "float":  # nothing to time: not even the AMX variant is built
        monkeypatch.setattr(torch_auto_dtype, "amx_kernels", lambda *a, **k: pytest.fail("AMX variant built"))
    with caplog.at_level(logging.INFO, logger="hetero"):
        executor = make_executor(folder, options=options)
    [line] = [r.getMessage() for r in caplog.records if "executor.dtype" in r.getMessage()]
    if activations == "float":
        assert executor.dtype == torch.float32 and fake_probe.runs == []
        assert "block codes on float activations" in line
    else:
        assert sorted(set(fake_probe.runs)) == sorted(CANDIDATES[cpu_flag_set])


def other_values(model_dir, target):
    """A copy of ``model_dir`` elsewhere with every weight changed: a fine-tune of the same base."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, target)
    for path in target.glob("*.safetensors"):
        save_file({name: t + 1 for name, t in load_file(path).items()}, path)
    return target


@pytest.mark.parametrize("cpu_flag_set", ["amx"], indirect=True)
def test_a_fine_tune_of_a_measured_model_reads_its_record_and_another_layout_is_measured(
    cpu_flag_set, fake_probe, tiny_model_dirs, make_executor, tmp_path, monkeypatch
):
    """The record is kept by the model's layout (shapes, tensor types), not its folder or values."""
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = tiny_model_dirs["llama"][0]
    make_executor(model_dir, options=AUTO)
    measured = len(fake_probe.runs)
    assert measured == len(CANDIDATES["amx"])
    make_executor(other_values(model_dir, tmp_path / "fine-tune"), options=AUTO)
    assert len(fake_probe.runs) == measured  # read from the record
    other = tmp_path / "bf16-copy"
    shutil.copytree(model_dir, other)
    from safetensors.torch import load_file, save_file

    for path in other.glob("*.safetensors"):
        save_file({name: t.to(torch.bfloat16) for name, t in load_file(path).items()}, path)
    make_executor(other, options=AUTO)
    assert len(fake_probe.runs) == 2 * measured  # stored in another type: measured again
