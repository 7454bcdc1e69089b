"""hetero-plugins-triton: the Triton flash-decoding executor. Imports no triton here."""

from hetero_core.hookspecs import hookimpl


@hookimpl
def register_executors(register):
    register("triton", _create_triton_executor, needs_model=True, preflight=_not_implemented)


def _not_implemented():
    return ["the Triton flash-decoding executor is not implemented yet in hetero-plugins-triton 0.1.0"]


def _create_triton_executor(ctx):
    from hetero_core.errors import PluginError

    raise PluginError(
        "executor 'triton' (flash-decoding) is not implemented yet in hetero-plugins-triton 0.1.0; "
        "use --executor torch"
    )
