"""Model code shared by the real executors: config, Llama-family layers, the attention-backend seam,
checkpoint readers, loading, tensor parallelism, and ``runner.ModelRunner`` (a model with its paged
KV cache, run a step at a time). ``cpu/`` is the torch executor's CPU runtime, built on this code
and never imported by it.

Import the submodules you need (``hetero_core.model.loader``, ``.runner``, ...); this package module
itself imports nothing and does nothing on import.
"""
