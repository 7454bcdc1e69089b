"""Scaling one engine over several processes with ``torch.distributed`` (tensor and pipeline
parallelism).

``tensor_parallel_executor.TensorParallelExecutor`` is what the engine sees: rank 0, in the
engine's process, plus one worker per other rank, started by a launcher (``worker_launcher``): a
local process (``python -m hetero_core.distributed.worker``, started and watched by
``worker_process``; the ``mp`` backend) or a Ray actor on a cluster (``ray_launcher``, ``ray_rank``;
the ``ray`` backend), both running ``worker.run``. ``failures`` turns what the workers reported into
one error; ``process_group`` sets up the group. Importing this package imports nothing heavy; its
modules import torch, and only the Ray ones Ray.
"""
