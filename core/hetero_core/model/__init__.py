"""Model code shared by the real executors: config, Llama-family layers, attention backends, loading.

Import the submodules you need (``hetero_core.model.loader``, ``.embedded``, ...); this package
module itself imports nothing heavy. It does one thing on import: before any submodule loads
torch, it chooses how OpenMP's threads wait (a short spin where the CPUs are idle, sleep where
other processes keep them busy; see ``cpu_threads``).
"""

from hetero_core.model.cpu.threads import choose_openmp_wait

choose_openmp_wait()
