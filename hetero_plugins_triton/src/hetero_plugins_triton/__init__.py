"""hetero-plugins-triton: the Triton flash-decoding executor. Imports neither torch nor triton here.

Public beyond the executor (``__all__``), loaded on first use because they import torch and triton:
the paged decode kernel's launch wrapper ``decode_attention``, its split-K heuristic
``choose_num_splits`` and ``import_triton(interpret)``, which imports triton for the GPU or its CPU
interpreter (``hetero bench triton-decode`` uses the three).
"""

import importlib

from hetero_core import hookimpl
from hetero_plugins_triton.options import TritonExecutorOptions

# public name -> the module that defines it
_EXPORTS = {
    "decode_attention": "hetero_plugins_triton.kernels.decode_attention",
    "choose_num_splits": "hetero_plugins_triton.splits",
    "import_triton": "hetero_plugins_triton.kernels.compile",
}

__all__ = ["register_executors", *_EXPORTS]


def __getattr__(name: str):
    # No __dir__ on purpose: pluggy reads dir(plugin) when it registers this module, and must not
    # load torch and triton doing so.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hetero_plugins_triton' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


@hookimpl
def register_executors(register):
    register(
        "triton",
        _create_triton_executor,
        options=TritonExecutorOptions,
        needs_model=True,
        preflight=_cannot_run,
    )


def _cannot_run(options):
    from hetero_plugins_triton.requirements import cannot_run

    return cannot_run(options)


def _create_triton_executor(ctx):
    from hetero_plugins_triton.executor import create_triton_executor

    return create_triton_executor(ctx)
