"""hetero-plugins-mock: executors that need no model and import no torch: ``mock`` (deterministic
tokens through a real paged cache, for tests) and ``null`` (no per-token work, for measuring the
engine's own time per step)."""

from hetero_core import hookimpl
from hetero_plugins_mock.options import MockExecutorOptions, NullExecutorOptions


@hookimpl
def register_executors(register):
    register("mock", _create_mock_executor, options=MockExecutorOptions, needs_model=False)
    register("null", _create_null_executor, options=NullExecutorOptions, needs_model=False)


def _create_mock_executor(ctx):
    from hetero_plugins_mock.executor import MockExecutor

    return MockExecutor(ctx)


def _create_null_executor(ctx):
    from hetero_plugins_mock.null_executor import NullExecutor

    return NullExecutor(ctx)
