"""Peers of ``hetero bench offline``: other engines that run the same workload on the same machine.

A peer is an object with ``name`` (as ``--peers`` names it), ``label`` (shown in the table) and
``run(requests) -> PeerResult``; optionally ``decode_latency(prompt_token_ids, num_tokens) ->
seconds per token`` (batch-1 decode after the prefill) and ``close()``. ``run`` is called once per
round with the same requests: it must not reuse work from an earlier call (a prefix cache, say).

Peers are found by module: every module of this package with a ``PEERS`` dict of name ->
factory(PeerContext) is a source (``hf_generate``, ``vllm_cpu``), so adding a peer is adding one
file; ``hetero_engine`` is the reference side every ratio is to. A factory raises
``PeerUnavailable("why, and the command that fixes it")`` when it cannot run here (a package or a
virtual environment missing), and so may ``run`` (a server that does not start): the benchmark
prints that one line and goes on without the peer. Modules import light: heavy imports belong in
the factory.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hetero_bench.workload import Request

NOT_PEERS = ("hetero_engine", "vllm_worker")  # the reference side; a script vLLM's own Python runs


class PeerUnavailable(Exception):
    """This peer cannot run here; the message says why (and what to install)."""


@dataclass(frozen=True)
class PeerResult:
    elapsed_s: float  # wall time of run(), the requests in, every output token out
    output_tokens: int  # tokens generated (the workload asks for sum(max_tokens))
    extra: dict[str, Any] = field(default_factory=dict)  # anything else worth keeping in the JSON

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class PeerContext:
    """What a peer needs to run the same model as Hetero's engine."""

    model_dir: Path | None  # the model as an HF directory (None: the executor runs no model, e.g. mock)
    dtype: str | None  # the engine's compute dtype ("float32", "bfloat16", ...), None if unknown
    num_threads: int | None  # CPU threads to use (None: the peer's own choice)
    hf_batch_size: int = 32  # the HF static batch's size


class Peer(Protocol):
    name: str
    label: str

    def run(self, requests: list[Request]) -> PeerResult: ...


PeerFactory = Callable[[PeerContext], Peer]


def available_peers() -> dict[str, PeerFactory]:
    """Every peer name -> factory, from the modules of this package that define ``PEERS``."""
    found: dict[str, PeerFactory] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module_info.name not in NOT_PEERS:
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            found.update(getattr(module, "PEERS", {}))
    return found
