"""hetero-bench: Hetero's benchmarks, run as ``hetero bench NAME`` (one benchmark per question).

The package adds the ``bench`` command to ``hetero`` through core's ``register_commands`` hook
(``plugin.py``, found through the ``hetero`` entry point group like any plugin). Benchmarks are
modules of ``hetero_bench.benchmarks``, listed in ``catalog.py``; they use Hetero through its public
names only (``hetero_core``'s ``__all__`` and ``LLM``, settings, ``llm.engine``). Importing this
package imports nothing else.
"""
