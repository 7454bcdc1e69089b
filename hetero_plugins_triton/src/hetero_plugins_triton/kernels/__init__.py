"""Triton kernels, one per file: the ``@triton.jit``-style body with ``tl.constexpr`` tiles, and a
launch wrapper that checks shapes, dtypes and strides and picks the grid.

The bodies are plain functions compiled on demand (``compile_kernel``), so one process can run the
same kernel compiled for the GPU or through Triton's CPU interpreter, chosen per executor.
"""
