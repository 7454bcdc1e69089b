"""Scaling one engine over several processes with ``torch.distributed`` (tensor parallelism).

``tensor_parallel_executor.TensorParallelExecutor`` is what the engine sees: rank 0, in the
engine's process, plus one ``worker`` process per other rank (``python -m
hetero_core.distributed.worker``, started and watched by ``worker_process``); ``failures`` turns what
the workers reported into one error; ``process_group`` sets up the group. Importing this package
imports nothing heavy; its modules import torch.
"""
