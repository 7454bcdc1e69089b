"""What an executor author imports: the context a factory receives, the batch it runs, the output it
returns, the declaration of what else it can do and the paged-layout helper. See docs/hooks.md
(``register_executors``).

    from hetero_core import hookimpl
    from hetero_core.executor import Batch, ExecutorCapabilities, ExecutorContext, ExecutorOutput

    class EchoExecutor:
        capabilities = ExecutorCapabilities()  # nothing optional: no block copies, swap, prompt logits, ...

        def __init__(self, ctx: ExecutorContext):
            self.eos_token_id = ctx.eos_token_id

        def execute(self, batch: Batch) -> ExecutorOutput:
            return ExecutorOutput(token_ids=[batch.token_ids[batch.query_start_loc[i + 1] - 1]
                                             for i in batch.sample_indices])

        def shutdown(self):
            pass

    @hookimpl
    def register_executors(register):
        register("echo", EchoExecutor, needs_model=False)

Test it with ``hetero_core.testing.ExecutorContract``. Model code for executors that run a real model
is the documented ``hetero_core.model`` package (config, loader, attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hetero_core.engine.executor_capabilities import ExecutorCapabilities
from hetero_core.engine.scheduling.batch import Batch, ExecutorOutput, slot_of

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl  # noqa: F401

__all__ = ["Batch", "Executor", "ExecutorCapabilities", "ExecutorContext", "ExecutorOutput", "slot_of"]


@runtime_checkable
class Executor(Protocol):
    """Runs the model (or a stand-in) on one batch per step.

    The executor owns its KV cache: ``num_blocks`` blocks of ``block_size`` token slots, addressed
    by the batch's ``slot_mapping`` and ``block_tables``. It must not keep per-request state
    beyond what the KV cache holds: everything else arrives in the batch.
    """

    capabilities: ExecutorCapabilities

    def execute(self, batch: Batch) -> ExecutorOutput: ...

    def shutdown(self) -> None: ...

    # What else it can do is declared in ``capabilities`` (each field documented there), never probed:
    # the methods a declaration names, each taking ``(source, destination)`` block pairs or block ids:
    # ``copy_blocks(pairs)`` copies device blocks (copy-on-write for the prefix cache, ``block_copy``);
    # ``swap_out(pairs)`` device -> CPU swap blocks and ``swap_in(pairs)`` back (``block_swap``, for
    # swap preemption; ``hetero_core.engine.kv.block_transfer``); ``export_blocks(block_ids) ->
    # list[tuple[KVTensor, ...]]`` returns whole blocks, per layer its tensors (CPU bytes in the
    # executor's own layout, blocks along ``kv_block_dim``; ``kv_export``) and ``import_blocks(block_ids,
    # layers)`` writes such blocks (from an executor of the same model, dtype and block size) into
    # ``block_ids``, raising ValueError before writing if they do not fit (``kv_import``; prefill/decode
    # disaggregation, docs/disaggregation.md).


@dataclass(frozen=True)
class ExecutorContext:
    """What an executor factory receives."""

    settings: Any  # hetero_core.settings.HeteroSettings
    options: Any  # the plugin's validated options model instance, or None
    model_dir: Path | None  # local model directory (None for executors that need no model)
    num_blocks: int
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int  # tokens in one step (max_total_tokens)
    max_num_seqs: int  # sequences in one step (max_batch_size)
    eos_token_id: int | None
    vocab_size: int
    num_swap_blocks: int = 0  # CPU swap space to allocate for swap_out/swap_in (0: none; see block_transfer)
    # Tensor parallelism (executors registered with ``tensor_parallel=True`` only): this executor is
    # rank ``tensor_parallel_rank`` of ``tensor_parallel_size``, each owning its shard of the model
    # and of the KV heads; the default process group of ``torch.distributed`` is already up.
    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    enable_expert_parallel: bool = False  # a MoE model's experts split across those ranks (settings)
    # Pipeline parallelism (executors registered with ``pipeline_parallel=True`` only): this executor
    # runs stage ``pipeline_parallel_rank`` of ``pipeline_parallel_size``, each holding a contiguous run
    # of the decoder layers and their KV cache; its process is global rank
    # ``pipeline_parallel_rank * tensor_parallel_size + tensor_parallel_rank``.
    pipeline_parallel_size: int = 1
    pipeline_parallel_rank: int = 0
