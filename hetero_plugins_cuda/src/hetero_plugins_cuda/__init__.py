"""hetero-plugins-cuda: the flash-attn executor. Imports neither torch nor flash_attn here."""

from hetero_core import hookimpl


@hookimpl
def register_executors(register):
    from hetero_plugins_cuda.options import CudaExecutorOptions

    register(
        "cuda",
        _create_cuda_executor,
        options=CudaExecutorOptions,
        needs_model=True,
        preflight=_missing_requirements,
    )


def _missing_requirements(options):
    from hetero_plugins_cuda.preflight import missing_requirements

    return missing_requirements()


def _create_cuda_executor(ctx):
    from hetero_plugins_cuda.executor import create_cuda_executor

    return create_cuda_executor(ctx)
