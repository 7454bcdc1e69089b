"""hetero-plugins-mock: a deterministic executor that needs no model and imports no torch."""

from hetero_core.executor import hookimpl

from hetero_plugins_mock.options import MockExecutorOptions


@hookimpl
def register_executors(register):
    register("mock", _create_mock_executor, options=MockExecutorOptions, needs_model=False)


def _create_mock_executor(ctx):
    from hetero_plugins_mock.executor import MockExecutor

    return MockExecutor(ctx)
