"""``dtype = "auto"`` on the CPU: the faster of fp32 and bf16 (and of bf16's kernel layouts) for this model on
this CPU, decided from timed steps of the model's own layers, once, and remembered.

A matmul's rate is not
the engine's: on a 2-core Xeon with AMX oneDNN's bf16 matmul ran 3x its fp32 one while Hetero's bf16 was
slower end to end than its fp32 (its kernels, attention and element-wise steps are not oneDNN's); on a Xeon
without AMX bf16 is half the fp32 rate; on AMD Zen 4/5 it is faster. So the first start of a model on a CPU
builds, in each candidate whose weights fit in memory (``torch_auto_dtype``), models of the checkpoint's
first layers (``probe_model``: 1 and 3 layers, packed as the executor runs them) and times a few real steps
of each (``dtype_probe``): a prefill of ``PREFILL_TOKENS`` tokens, a decode step of ``DECODE_SEQS``
sequences and one of a single sequence (the best of ``REPEATS`` after a warm-up), extrapolated to the
model's layer count. Each candidate's time for ``REFERENCE``, a workload shaped like the offline benchmark's
(its prompt tokens at the prefill's rate, its output tokens at the batched decode's, plus one 64-token
single-stream answer), decides: the fastest wins; fp32 keeps a tie within ``TIE`` (the steps' spread between
repeats on a shared 2-core VM; bf16 rounds activations, so it must earn its place). The figures go to the
``-v`` log line and to ``<cache_dir>/cpu_dtype_choice.json``, keyed by the CPU (model name, flags), the
versions (torch, Hetero, the kernels' build, ``PROBE_VERSION``), the threads and the model's layout
(``checkpoint_layout``: shapes and tensor types, so a fine-tune or a copy of a model measured before is not
measured again); later starts read the record (a record that lacks a candidate that now fits is measured
again). The file carries a checksum (``cache_file``); a damaged file or record is measured again with one
warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hetero_core.cache import cache_file
from hetero_core.logging import get_logger

log = get_logger("hetero.executor")

CACHE_FILE = "cpu_dtype_choice.json"
PREFILL_TOKENS = 128  # two 64-token prompts in one step
DECODE_SEQS = 32  # the offline benchmark's batch
CONTEXT = 64  # tokens each decoding sequence has in its cache
REPEATS = 3
# (prompt tokens, batched decode steps, single-sequence decode steps) of the reference workload: the
# offline benchmark's 2,396 prompt and 1,384 output tokens (43 steps of 32), and a 64-token answer
REFERENCE = (2400, 43, 64)
TIE = 1.03  # a candidate must be this much faster than float32 to displace it
PREFERRED = "float32"
PROBE_VERSION = 2  # 2: the first layers timed and extrapolated (1: whole models); in the record's key
# a candidate stops being timed once one round of its larger probe model is this much slower on the
# reference workload than the fastest candidate so far on the same probe model: it is not going to win
LOSING = 1.5


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one step of each probe (the best of ``REPEATS``)."""

    prefill_s: float  # PREFILL_TOKENS prompt tokens
    decode_s: float  # DECODE_SEQS sequences, one token each
    single_s: float  # one sequence, one token

    def workload_s(self) -> float:
        """The reference workload's estimated time."""
        tokens, batched, single = REFERENCE
        return self.prefill_s / PREFILL_TOKENS * tokens + self.decode_s * batched + self.single_s * single

    def as_list(self) -> list[float]:
        return [self.prefill_s, self.decode_s, self.single_s]

    def is_valid(self) -> bool:
        return all(_positive(v) for v in self.as_list())


class Outpaced(Exception):
    """A measurement stopped early, its candidate ``LOSING`` times slower than its rival on one round;
    ``times``: the whole model's, estimated from that round (scaled as the rival's times scale)."""

    def __init__(self, times: StepTimes):
        super().__init__(f"outpaced: {times}")
        self.times = times


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # the candidate picked
    times: dict[str, StepTimes]
    reason: str  # one line: what was picked and why, with the figures
    cached: bool = False


def decide(times: dict[str, StepTimes], estimated: frozenset[str] = frozenset()) -> tuple[str, str]:
    """The candidate ``times`` show fastest on the reference workload (``PREFERRED`` unless another is
    at least ``TIE`` times faster) and the reason, with every candidate's figures; ``estimated``: the
    candidates whose times are estimates from one round (``Outpaced``)."""
    if not times or not all(t.is_valid() for t in times.values()):
        raise ValueError(f"need positive finite step times for every candidate, got {times}")
    fastest = min(times, key=lambda name: times[name].workload_s())
    name = fastest
    if PREFERRED in times and fastest != PREFERRED:
        if times[PREFERRED].workload_s() < TIE * times[fastest].workload_s():
            name = PREFERRED
    figures = "; ".join(_describe(candidate, t, candidate in estimated) for candidate, t in times.items())
    if len(times) == 1:
        return name, f"the only candidate ({figures})"
    others = [c for c in times if c != name]
    ratios = ", ".join(
        f"{times[c].workload_s() / times[name].workload_s():.2f}x {c}'s speed"
        + (" (estimated)" * (c in estimated))
        for c in others
    )
    verdict = "within the tie margin of" if name != fastest else "faster than"
    return name, f"{name} {verdict} the others on the reference workload ({ratios}); {figures}"


def choose(candidates: list[str], measure, key: str, cache_dir: Path) -> DtypeChoice:
    """The choice among ``candidates`` for ``key``: from the cache, or ``measure(name, rival)`` ->
    StepTimes for each candidate in the order given (then cached); ``rival``: the fastest candidate
    measured so far (None for the first), against which ``measure`` may stop early (``Outpaced``). One
    candidate: no measurement."""
    if len(candidates) == 1:
        return DtypeChoice(candidates[0], {}, "the only candidate on this CPU")
    path = Path(cache_dir) / CACHE_FILE
    known = _read(path)
    record = known.get(key)
    if record is not None and not _lacks(record, candidates):
        times = _times(record, candidates)
        if times is not None:
            name, reason = decide(times, _estimated(record))
            return DtypeChoice(name, times, f"{reason} (measured at an earlier start)", cached=True)
        cache_file.warn_rebuilding(
            cache_file.CacheFileInvalid(
                path, f"the record of this model and CPU is unusable: {str(record)[:200]}"
            )
        )
    times, outpaced = {}, []
    for name in candidates:
        whole = {c: t.workload_s() for c, t in times.items() if c not in outpaced}
        try:
            times[name] = measure(name, min(whole, key=whole.get) if whole else None)
        except Outpaced as stop:
            times[name] = stop.times
            outpaced.append(name)
    name, reason = decide(times, frozenset(outpaced))
    record = {"choice": name, "times": {c: t.as_list() for c, t in times.items()}, "estimated": outpaced}
    _write(path, {**{k: v for k, v in known.items() if k != key}, key: record})
    return DtypeChoice(name, times, reason)


def cache_key(cpu: str, versions: str, threads: int, layout: str) -> str:
    """The record's key: the CPU, the versions, the threads and the model's layout (``checkpoint_layout``:
    its shapes and tensor types, the same for every fine-tune of one base model)."""
    return f"{cpu} | {versions} | probe {PROBE_VERSION} | threads {threads} | layout {layout}"


def _describe(name: str, t: StepTimes, estimated: bool = False) -> str:
    stopped = " (outpaced: estimated from one round)" if estimated else ""
    return (
        f"{name}{stopped}: prefill {PREFILL_TOKENS} tokens {t.prefill_s * 1e3:.1f} ms, decode "
        f"{DECODE_SEQS} seqs {t.decode_s * 1e3:.1f} ms, decode 1 seq {t.single_s * 1e3:.1f} ms, reference "
        f"workload {t.workload_s():.2f} s"
    )


def _estimated(record) -> frozenset[str]:
    """The record's candidates whose times are estimates (none in a record from before ``LOSING``)."""
    names = record.get("estimated", [])
    return frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) else frozenset()


def _lacks(record, candidates: list[str]) -> bool:
    """A well-formed record without some of ``candidates`` (measured when fewer fitted, or before the
    AMX variant passed its gate): measured again, it is not damage."""
    raw = record.get("times") if isinstance(record, dict) else None
    return isinstance(raw, dict) and bool(raw) and not set(candidates) <= set(raw)


def _times(record, candidates: list[str]) -> dict[str, StepTimes] | None:
    """The record's step times of ``candidates`` (it may hold more: those that do not fit now); None
    when it is not a usable record."""
    try:
        raw = record["times"]
        if not set(candidates) <= set(raw):
            return None
        times = {name: StepTimes(*(float(v) for v in raw[name])) for name in candidates}
    except (KeyError, TypeError, ValueError):
        return None
    return times if all(t.is_valid() for t in times.values()) else None


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _read(path: Path) -> dict:
    """The records by key; {} when there are none or the file is damaged (one warning)."""
    return cache_file.read_json_object(path)


def _write(path: Path, data: dict) -> None:
    cache_file.write_json_object(path, data, "executor.cpu_dtype_choice_not_cached")
