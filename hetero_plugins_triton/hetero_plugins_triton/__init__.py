"""hetero-plugins-triton: the Triton flash-decoding executor. Imports neither torch nor triton here."""

from hetero_core.executor import hookimpl

from hetero_plugins_triton.options import TritonExecutorOptions


@hookimpl
def register_executors(register):
    register("triton", _create_triton_executor, options=TritonExecutorOptions, needs_model=True,
             preflight=_missing_packages)


def _missing_packages():
    from hetero_plugins_triton.requirements import missing_packages

    return missing_packages()


def _create_triton_executor(ctx):
    from hetero_plugins_triton.executor import create_triton_executor

    return create_triton_executor(ctx)
