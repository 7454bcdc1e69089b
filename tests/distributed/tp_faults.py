"""A torch executor that fails on purpose on one rank, for the tensor-parallel failure tests.

This module is the plugin: it registers the ``faulty`` executor (with ``tensor_parallel=True``); its
factory is module-level so the worker processes can unpickle it. Options come through the settings
section ``[executor.faulty]``: ``rank`` (which rank fails), ``after`` (how many ``execute`` calls
succeed first; -1: it fails while starting, in the factory) and ``how``: ``raise`` a RuntimeError,
``exit`` with code 3, or ``hang`` for good (both after a line on stderr).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict

from hetero_core.plugin_system.hookspecs import hookimpl

EXIT_CODE = 3


class FaultyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int = 1
    after: int = 2
    how: Literal["raise", "exit", "hang"] = "raise"


def fail(rank: int, how: str) -> None:
    if how == "raise":
        raise RuntimeError(f"injected fault on rank {rank}")
    print(
        f"faulty executor: rank {rank} {'exits' if how == 'exit' else 'hangs'}", file=sys.stderr, flush=True
    )
    if how == "exit":
        os._exit(EXIT_CODE)
    while True:
        time.sleep(60)


def create_faulty_executor(ctx):
    from hetero_core.default_plugins.torch_executor import TorchExecutor, TorchExecutorOptions

    options, rank = ctx.options, ctx.tensor_parallel_rank
    if rank == options.rank and options.after < 0:
        fail(rank, options.how)

    class FaultyExecutor(TorchExecutor):
        def __init__(self):
            super().__init__(ctx, options=TorchExecutorOptions(dtype="float32"))  # the same on every rank
            self.calls = 0

        def execute(self, batch):
            self.calls += 1
            if rank == options.rank and self.calls > options.after:
                fail(rank, options.how)
            return super().execute(batch)

    return FaultyExecutor()


@hookimpl
def register_executors(register):
    register("faulty", create_faulty_executor, options=FaultyOptions, needs_model=True, tensor_parallel=True)
