"""Model code shared by the real executors: config, Llama-family layers, attention backends, loading.

Import the submodules you need (``hetero_core.model.loader``, ``.embedded``, ...); this package
module itself imports nothing heavy.
"""
