"""A torch executor that fails on purpose on one rank, for the tensor-parallel failure tests.

This module is the plugin: it registers the ``faulty`` executor (with ``tensor_parallel=True``); its
factory is module-level so the spawned workers can unpickle it. Options come
through the settings section ``[executor.faulty]``: ``rank`` (which rank fails) and ``after``
(how many ``execute`` calls succeed first).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from hetero_core.hookspecs import hookimpl


class FaultyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int = 1
    after: int = 2


def create_faulty_executor(ctx):
    from hetero_core.default_plugins.torch_executor import TorchExecutor, TorchExecutorOptions

    class FaultyExecutor(TorchExecutor):
        def __init__(self):
            super().__init__(ctx, options=TorchExecutorOptions(dtype="float32"))  # the same on every rank
            self.calls = 0

        def execute(self, batch):
            self.calls += 1
            if ctx.tensor_parallel_rank == ctx.options.rank and self.calls > ctx.options.after:
                raise RuntimeError(f"injected fault on rank {ctx.tensor_parallel_rank}")
            return super().execute(batch)

    return FaultyExecutor()


@hookimpl
def register_executors(register):
    register("faulty", create_faulty_executor, options=FaultyOptions, needs_model=True, tensor_parallel=True)
