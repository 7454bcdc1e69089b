"""Model code shared by the real executors: config, Llama-family layers, attention backends, loading.

Import the submodules you need (``hetero_core.model.loader``, ``.embedded``, ...); this package
module itself imports nothing heavy. It does one thing on import: before any submodule loads
torch, it asks OpenMP's threads to sleep rather than spin while they wait (see ``cpu_threads``).
"""

from hetero_core.model.cpu_threads import prefer_passive_openmp_wait

prefer_passive_openmp_wait()
