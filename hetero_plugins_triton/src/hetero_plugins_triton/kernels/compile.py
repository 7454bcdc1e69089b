"""Import triton in the right mode and compile kernel bodies for the GPU or the CPU interpreter.

Triton fixes its mode when it is imported: with ``TRITON_INTERPRET=1`` its standard library
(``tl.max``, ``tl.sum``, ``tl.zeros`` ...) is built for the CPU interpreter, otherwise for the GPU
compiler, for the life of the process. ``import_triton(interpret)`` imports it in the mode asked
for (setting the variable only for the import, so nothing leaks into child processes) and says so
clearly when triton is already loaded in the other mode.

Kernel bodies are plain functions wrapped on demand by ``compile_kernel``; interpreted launches
run with ``TRITON_INTERPRET=1`` set for their duration, as triton's interpreter expects.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from functools import cache

from hetero_core import ConfigError


def import_triton(interpret: bool) -> None:
    """Import triton for the interpreter (``interpret``) or the GPU; ConfigError if it is already
    imported in the other mode."""
    if "triton" not in sys.modules and interpret:
        with interpreter_environment():
            import triton.language  # noqa: F401
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    loaded_for_interpreter = isinstance(tl.max, InterpretedFunction)
    if loaded_for_interpreter != interpret:
        wanted, loaded = (
            ("the CPU interpreter", "the GPU") if interpret else ("the GPU", "the CPU interpreter")
        )
        raise ConfigError(
            f"executor 'triton' needs triton set up for {wanted}, but this process already imported it for "
            f"{loaded}; start a new process (with TRITON_INTERPRET=1 set from the start for the interpreter)"
        )


@contextmanager
def interpreter_environment():
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


class _InterpretedKernel:
    """``kernel[grid](...)`` through triton's interpreter, with its environment set for the launch."""

    def __init__(self, body: Callable):
        from triton.runtime.interpreter import InterpretedFunction

        self.function = InterpretedFunction(body)

    def __getitem__(self, grid):
        launch = self.function[grid]

        def run(*args, **kwargs):
            with interpreter_environment():
                return launch(*args, **kwargs)

        return run


@cache
def compile_kernel(body: Callable, interpret: bool):
    """The launchable kernel for ``body``: ``kernel[grid](*args, **constexprs)``."""
    if interpret:
        return _InterpretedKernel(body)
    from triton.runtime.jit import JITFunction

    return JITFunction(body)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
