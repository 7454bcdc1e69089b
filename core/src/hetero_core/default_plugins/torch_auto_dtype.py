"""``dtype = "auto"`` for the torch executor on the CPU: the candidates this CPU offers whose weights fit
in memory (``model/cpu/memory_fit.py``), each timed on models of the checkpoint's first layers as the
executor runs them (``model/cpu/dtype_choice.py`` decides and remembers, ``model/cpu/dtype_probe.py``
times, ``model/cpu/probe_model.py`` builds the few-layer models and extrapolates).

Candidates: ``float32`` everywhere; ``bfloat16`` where the CPU computes bf16 natively (avx512_bf16 or
amx_bf16, and torch's oneDNN takes it), and elsewhere where fp32's weights do not fit but the compiled
kernels run bf16 ones (widened to fp32 in their linears: every x86 CPU they build for; an 8B bf16
checkpoint on a 24 GB AVX2 machine); ``bfloat16-amx`` beside it where the kernels' AMX variant
passes its gate (``model/cpu/amx.py``; option ``amx_linears``), ``bfloat16`` then being the AVX-512
one. A candidate that does not fit is skipped (its reason in the ``executor.dtype`` line); none that
fits: a ``ConfigError``. With one candidate left nothing is timed. The first start of a model on a
CPU builds, per candidate, a 1-layer and a 3-layer model (``probe_model.PROBE_LAYERS``; no
prepared-weights file: the whole model is loaded once, in the dtype chosen) and runs
``dtype_probe``'s steps on each; later starts read the record.
On a GGUF (with the kernels and ``block_code_weights``) every candidate keeps the file's codes
(``gguf_codes_loader``): no candidate loads the model's weights in fp32, and the choice is only of
how activations and attention run. With float code activations (``code_activations = "float"``, the
default) that choice is float32, untimed: the code linears compute in fp32 whatever the dtype, and in
bf16 they lose the fused decode step (``fused_decode``), so bf16 is slower at every step (the
embedded model, whole, on the 2-core AMX Xeon: prefill 420 against 302 ms, a 32-sequence decode 151
against 106, a single decode 34.6 against 16.8; its few-layer probe had ranked bf16 on AMX first).
"""

from __future__ import annotations

import gc
import hashlib

import torch

import hetero_core
from hetero_core.logging import get_logger
from hetero_core.model.cpu import compute_dtype, dtype_choice, dtype_probe, probe_model
from hetero_core.model.cpu.amx import amx_kernels
from hetero_core.model.cpu.checkpoint_layout import checkpoint_layout
from hetero_core.model.cpu.cpu_info import cpu_flags, cpu_model_name
from hetero_core.model.cpu.memory_fit import MemoryFit
from hetero_core.model.freed_memory import release_freed_memory

log = get_logger("hetero.executor")


def auto_candidates(
    kernels, amx: bool = True, widened_bf16: bool = False
) -> dict[str, tuple[torch.dtype, object]]:
    """Candidate name -> (dtype, the kernels it runs on) on this CPU; ``amx``: the AMX variant may be one.
    ``widened_bf16``: without native bf16, bf16 weights are a candidate too where the compiled kernels
    run them (their bf16 linears widen each weight to fp32: half the bytes a decode step reads), never
    on torch's emulated bf16."""
    candidates = {"float32": (torch.float32, kernels)}
    if compute_dtype.cpu_has_native_bf16():
        candidates["bfloat16"] = (torch.bfloat16, kernels)
        variant = amx_kernels(kernels) if amx and kernels is not None else None
        if variant is not None:
            candidates["bfloat16-amx"] = (torch.bfloat16, variant)
    elif widened_bf16 and kernels is not None:
        candidates["bfloat16"] = (torch.bfloat16, kernels)
    return candidates


def choose_auto_dtype(
    model_dir, options, kernels, build, cache_dir, fit: MemoryFit | None = None
) -> tuple[torch.dtype, object, str]:
    """(dtype, kernels, reason) for ``dtype = "auto"``: ``build(dtype, kernels, num_blocks, block_size,
    num_layers=n, model=m)`` makes a runner of a candidate on the checkpoint's first ``n`` layers to
    time (on ``m``, the larger probe model's view, where it is not None);
    ``fit``: the candidates whose weights do not fit are skipped (None: all are kept)."""
    float_codes = _float_code_linears(model_dir, kernels)
    if float_codes:  # (before the candidates: the AMX variant need not be built for nothing)
        offered = {"float32": (torch.float32, kernels)}
    else:  # without native bf16, bf16 weights on the kernels where fp32's do not fit (a 15 GB 8B on 24 GB)
        fp32_problem = fit.problem("float32") if fit is not None else None
        offered = auto_candidates(kernels, options.amx_linears, widened_bf16=fp32_problem is not None)
    skipped = {name: fit.problem(_dtype_name(dtype)) for name, (dtype, _) in offered.items()} if fit else {}
    skipped = {name: problem for name, problem in skipped.items() if problem is not None}
    candidates = {name: offered[name] for name in offered if name not in skipped}
    for name, problem in skipped.items():
        log.info("executor.dtype_candidate_skipped", candidate=name, reason=problem)
    if not candidates:
        raise fit.none_fits(list(dict.fromkeys(_dtype_name(d) for d, _ in offered.values())))
    num_layers = probe_model.num_hidden_layers(model_dir)
    layer_counts = probe_model.probe_layers(num_layers)
    timer = CandidateTimer(candidates, build, layer_counts, num_layers)

    key = ""  # one candidate: nothing measured, nothing recorded (nor the layout read)
    if len(candidates) > 1:
        layout = checkpoint_layout(model_dir)
        key = dtype_choice.cache_key(_cpu(), _versions(options, kernels), torch.get_num_threads(), layout)
    # the likeliest fastest first (the AMX variant, then bf16): the slower ones are then outpaced early
    choice = dtype_choice.choose(list(reversed(candidates)), timer.measure, key, cache_dir)
    if timer.probed:  # probe models were loaded and freed
        release_freed_memory()
    dtype, chosen_kernels = candidates[choice.name]
    reason = choice.reason
    if float_codes:
        reason = (
            "the linears are block codes on float activations: float32 (in bf16 the same fp32 code "
            "linears would run without the fused decode step)"
        )
    if timer.probed:
        counts = " and ".join(str(c) for c in layer_counts)
        reason += f" (timed on the first {counts} of {num_layers} layers, extrapolated)"
    if skipped:
        reason += "; skipped: " + "; ".join(f"{name}: {problem}" for name, problem in skipped.items())
    return dtype, chosen_kernels, reason


class CandidateTimer:
    """Times each candidate on the checkpoint's first layers (``probe_model.probe_layers``: the larger
    model first, the smaller a view of it) and extrapolates to the whole model; ``measure`` is
    ``dtype_choice.choose``'s."""

    def __init__(self, candidates, build, layer_counts: tuple[int, ...], num_layers: int):
        self.candidates, self.build = candidates, build
        self.layer_counts, self.num_layers = sorted(layer_counts, reverse=True), num_layers
        self.probed = []  # every candidate a probe model was built for
        self.timed = {}  # candidate -> layer count -> StepTimes, of the candidates timed whole
        self.whole = {}  # candidate -> its whole model's StepTimes, extrapolated

    def measure(self, name: str, rival: str | None) -> dtype_choice.StepTimes:
        """``name``'s whole model's step times; ``Outpaced`` where the first round of its larger probe
        model is ``LOSING`` times slower than ``rival``'s (the whole model's then estimated from it)."""
        largest = self.layer_counts[0]
        ceiling = dtype_choice.LOSING * self.timed[rival][largest].workload_s() if rival else None
        per_count, outpaced = self._time(name, ceiling)
        if outpaced is not None:  # raised here, not in ``_time``: the first one's traceback held the runner
            raise dtype_choice.Outpaced(_scaled(outpaced, self.timed[rival][largest], self.whole[rival]))
        self.timed[name] = per_count
        steps = zip(*(t.as_list() for t in per_count.values()))
        self.whole[name] = dtype_choice.StepTimes(
            *(probe_model.extrapolate(dict(zip(per_count, step)), self.num_layers) for step in steps)
        )
        return self.whole[name]

    def _time(self, name: str, ceiling: float | None):
        """(layer count -> StepTimes, None), or (what it timed, the larger model's outpaced first round)."""
        dtype, variant = self.candidates[name]
        per_count, model, view = {}, None, None
        try:
            for count in self.layer_counts:
                view = probe_model.fewer_layers(model, count) if model is not None else None
                blocks = (dtype_probe.num_blocks(), dtype_probe.BLOCK_SIZE)
                runner = self.build(dtype, variant, *blocks, num_layers=count, model=view)
                model = runner.model if model is None else model
                self.probed.append(name)
                try:
                    per_count[count] = dtype_probe.time_steps(runner, None if per_count else ceiling)
                except dtype_choice.Outpaced as stop:
                    return per_count, stop.times
                finally:
                    runner.shutdown()
                    del runner
        finally:
            model = view = None
            gc.collect()  # this candidate's weights go before the next one loads
        return per_count, None


def _scaled(times, rival_probe, rival_whole) -> dtype_choice.StepTimes:
    """``times`` of a probe model scaled to the whole model, step by step, as the rival's scale."""
    steps = zip(times.as_list(), rival_probe.as_list(), rival_whole.as_list())
    return dtype_choice.StepTimes(*(t * whole / probe for t, probe, whole in steps))


def _float_code_linears(model_dir, kernels) -> bool:
    """True where the model's linears load as block codes (a GGUF) and run on float activations."""
    if kernels is None or kernels.int8_code_activations:
        return False
    from hetero_core.model.cpu.gguf_codes_loader import codes_source

    return codes_source(model_dir, torch.float32, kernels) is not None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cpu() -> str:
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    return f"{cpu_model_name()} | flags {flags}"


def _versions(options, kernels) -> str:
    """What else changes the steps' speed: the versions, the kernels' build, the options."""
    library = kernels.path.name if kernels is not None else "no kernels"
    settings = (
        options.prepack_weights,
        options.fused_decode,
        options.block_code_weights,
        options.code_activations,
        options.cpu_kernels,
    )
    return f"torch {torch.__version__} | hetero {hetero_core.__version__} | {library} | options {settings}"
