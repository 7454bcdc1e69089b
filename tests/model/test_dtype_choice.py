"""``dtype = "auto"`` on the CPU: the faster candidate on timed steps of the model, cached per CPU, model
and version; the figures in one log line. Timings are injected: nothing here measures a duration."""

from __future__ import annotations

import json
import logging

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
    def measure(name: str) -> StepTimes:
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
        self.faster, self.runs = "float32", []

    def time_steps(self, runner) -> StepTimes:
        self.runs.append(candidate_of(runner))
        return FAST if self.runs[-1] == self.faster else SLOW


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
    assert sorted(fake_probe.runs) == sorted(candidates)  # each candidate timed once
    assert "reference workload" in line and "2.00x" in line
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
