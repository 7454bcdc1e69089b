"""The kernels library's calls as ctypes types, read from ``csrc/hetero_kernels.h``: the one place the
ABI is written (every ``.c`` includes it, so the compiler holds each definition to its prototype).

The header's first section (up to its ``END OF THE PYTHON ABI`` line) is the calls Python makes: one
prototype each, ``int name(type arg, ...);`` or ``int name(void);``. Its parameter types map as C
passes them: ``int64_t`` to ``c_int64``, ``int`` to ``c_int``, ``float`` to ``c_float``, any pointer to
``c_void_p``; every call returns ``int``. A type outside that list is an error at load, naming it.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

HEADER = Path(__file__).with_name("csrc") / "hetero_kernels.h"
END_OF_PYTHON_ABI = "END OF THE PYTHON ABI"
_SCALARS = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}
_PROTOTYPE = re.compile(r"^int (\w+)\(([^;]*?)\);", re.MULTILINE | re.DOTALL)


def kernel_signatures(header: Path = HEADER) -> dict[str, list]:
    """Each call of the header's Python section -> its parameters' ctypes types, in the header's order."""
    text = header.read_text()
    python_abi = text.split(END_OF_PYTHON_ABI, 1)[0]
    return {name: _argtypes(name, params) for name, params in _PROTOTYPE.findall(python_abi)}


def _argtypes(name: str, params: str) -> list:
    params = " ".join(params.split())
    if params == "void":
        return []
    return [_ctype(name, param) for param in params.split(", ")]


def _ctype(name: str, param: str):
    if "*" in param:
        return ctypes.c_void_p
    words = param.removeprefix("const ").split()
    if len(words) == 2 and words[0] in _SCALARS:
        return _SCALARS[words[0]]
    raise ValueError(
        f"{HEADER.name}: {name}'s parameter {param!r} has no ctypes type; use a pointer or "
        f"one of {', '.join(_SCALARS)} (kernel_abi.py maps them)"
    )
