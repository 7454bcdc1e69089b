"""``ExecutorCapabilities``: what an executor can do beyond ``execute`` and ``shutdown``, declared once.

An executor gives its declaration as its ``capabilities`` attribute: a class attribute when it is
the same for every instance, else set in the constructor (it may depend on the model or the
context: the logits width, a KV pool sized from memory). Core reads nothing else about an executor:
the builder checks the declaration when the engine is built (``capabilities_problem``: every
declared transfer has its methods) and the engine reads ``executor.capabilities.<field>``; the
executor kit (``hetero_core.testing.ExecutorContract``) checks that the executor does what it
declares. The public name is ``hetero_core.executor.ExecutorCapabilities``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

from hetero_core.errors import PluginError
from hetero_core.logging import get_logger

__all__ = ["DECLARED_METHODS", "ExecutorCapabilities", "capabilities_problem", "check_capabilities"]

log = get_logger("hetero.executor")

# capability -> the executor methods it declares (each taking the arguments docs/hooks.md gives)
DECLARED_METHODS = {
    "block_copy": ("copy_blocks",),
    "block_swap": ("swap_out", "swap_in"),
    "kv_export": ("export_blocks",),
    "kv_import": ("import_blocks",),
    "pipelined_steps": ("start_step", "finish_step"),
}
_COUNTS = ("vocab_size", "num_kv_blocks")  # None or an int >= 1


@dataclass(frozen=True)
class ExecutorCapabilities:
    """An executor's declaration; every field's default is "not declared" (nothing optional)."""

    vocab_size: int | None = None
    """Width of the logits rows and range of the token ids it returns (a model's vocabulary may
    exceed the tokenizer's); None: the tokenizer's (``ctx.vocab_size``)."""
    num_kv_blocks: int | None = None
    """KV blocks in the pool when the executor sizes it itself (e.g. from GPU memory); the engine's
    allocator then hands out exactly these. None: ``ctx.num_blocks``."""
    supports_prompt_logits: bool = False
    """Returns ``ExecutorOutput.prompt_logits`` for the sequences ``batch.prompt_logits`` flags;
    without it the engine refuses ``prompt_logprobs`` with a one-line error."""
    supports_speculative_decoding: bool = False
    """Returns ``1 + n`` rows for a sampled sequence with ``n`` of ``batch.num_spec_tokens``; without
    it the engine refuses ``num_speculative_tokens > 0``."""
    prefers_async_scheduling: bool = False
    """Asks for async scheduling when the ``async_scheduling`` setting is unset (``execute`` then
    runs on the engine's executor thread while the next step is planned)."""
    block_copy: bool = False
    """Has ``copy_blocks(pairs)`` (device -> device, copy-on-write for the prefix cache); without it
    a fully cached prompt's last token is left uncached."""
    block_swap: bool = False
    """Has ``swap_out(pairs)`` / ``swap_in(pairs)`` (device <-> ``ctx.num_swap_blocks`` CPU swap
    blocks); without it ``preemption_mode = "swap"`` falls back to recompute with a warning."""
    kv_export: bool = False
    """Has ``export_blocks(block_ids)`` (a prefill engine's KV handoff, docs/disaggregation.md)."""
    kv_import: bool = False
    """Has ``import_blocks(block_ids, layers)`` (a decode engine's KV handoff)."""
    kv_block_dim: int = 0
    """The dimension of each exported tensor along which its blocks lie."""
    pipelined_steps: bool = False
    """Has ``start_step(batch)`` (the step begins; returns once the executor can take the next) and
    ``finish_step() -> ExecutorOutput`` (the oldest started step's output), so the engine keeps two
    steps of disjoint sequences in flight (a pipeline's stages on different steps at once)."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _COUNTS:
                ok, wanted = value is None or (_is_int(value) and value >= 1), "an int >= 1 or None"
            elif f.name == "kv_block_dim":
                ok, wanted = _is_int(value) and value >= 0, "an int >= 0"
            else:
                ok, wanted = isinstance(value, bool), "True or False"
            if not ok:
                raise TypeError(f"ExecutorCapabilities.{f.name} must be {wanted}, got {value!r}")

    @property
    def declared_methods(self) -> tuple[str, ...]:
        """The optional methods this declaration says the executor has."""
        return tuple(m for name, methods in DECLARED_METHODS.items() if getattr(self, name) for m in methods)


def capabilities_problem(executor) -> str | None:
    """Why ``executor``'s ``capabilities`` is not a usable declaration, or None: it must be an
    ``ExecutorCapabilities`` and every method it declares must be callable."""
    capabilities = executor.capabilities
    if not isinstance(capabilities, ExecutorCapabilities):
        return (
            f"its capabilities is a {type(capabilities).__name__}, not an ExecutorCapabilities "
            "(hetero_core.executor)"
        )
    # Checks the declaration; core never asks an executor what it has that it did not declare.
    missing = [m for m in capabilities.declared_methods if not callable(getattr(executor, m, None))]
    if missing:
        declared = [name for name, methods in DECLARED_METHODS.items() if set(methods) & set(missing)]
        return (
            f"it declares {', '.join(f'{n}=True' for n in declared)} but has no callable "
            f"{', '.join(missing)}; add the method(s) or leave the capability False"
        )
    return None


def check_capabilities(executor, executor_name: str) -> ExecutorCapabilities:
    """The executor's declaration (``ExecutorCapabilities``), refused with a one-line PluginError if
    unusable. An executor written before declarations existed (no ``capabilities`` attribute) keeps
    running with the default declaration (nothing optional), with a DeprecationWarning naming it."""
    if not hasattr(executor, "capabilities"):
        message = (
            f"executor '{executor_name}' ({type(executor).__name__}) declares no capabilities: it "
            "runs with ExecutorCapabilities() (no block copies, swap, KV transfer, prompt logits or "
            "speculative decoding; vocab_size and the KV pool as the context gives them); set its "
            "capabilities attribute (hetero_core.executor.ExecutorCapabilities, docs/hooks.md) - "
            "running without one is deprecated"
        )
        warnings.warn(message, DeprecationWarning, stacklevel=3)
        log.warning("executor.capabilities_undeclared", executor=executor_name, reason=message)
        try:
            executor.capabilities = ExecutorCapabilities()
        except AttributeError:  # __slots__, or a read-only property
            raise PluginError(
                f"executor '{executor_name}' ({type(executor).__name__}) declares no "
                "capabilities and none can be set on it; give it a capabilities attribute "
                "(hetero_core.executor.ExecutorCapabilities, docs/hooks.md)"
            ) from None
    problem = capabilities_problem(executor)
    if problem:
        raise PluginError(
            f"executor '{executor_name}' ({type(executor).__name__}): {problem} (docs/hooks.md)"
        )
    return executor.capabilities


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
