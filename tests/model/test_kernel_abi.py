"""The kernels' ABI is written once, in ``csrc/hetero_kernels.h``: every source includes it (the compiler
holds each definition to it), no source restates a prototype, and the ctypes calls are typed from it."""

from __future__ import annotations

import ctypes
import re

import pytest

from hetero_core.model.cpu import kernel_abi
from hetero_core.model.cpu.kernels import HEADERS, SOURCE_DIR, SOURCES


def test_every_source_includes_the_abi_header_and_restates_none_of_it():
    names = set(kernel_abi.kernel_signatures())
    assert names, "the header declares no kernel"
    assert "hetero_kernels.h" in HEADERS
    for source in SOURCES:
        text = (SOURCE_DIR / source).read_text()
        assert '#include "hetero_kernels.h"' in text, source
        declared = set(re.findall(r"^int (\w+)\([^{;]*\);", text, re.MULTILINE))
        assert not declared, f"{source} restates {sorted(declared)}"


def test_the_header_types_every_call_the_python_side_makes():
    signatures = kernel_abi.kernel_signatures()
    assert signatures["swiglu_pair_columns"] == [] and signatures["decode_layers"] == [ctypes.c_void_p] * 2
    assert signatures["rms_norm_bf16"][-2:] == [ctypes.c_float, ctypes.c_int]
    kernels = ("rms_norm", "silu_mul", "rotary", "paged_decode_attention", "paged_prefill_attention")
    assert {f"{kernel}_{suffix}" for kernel in kernels for suffix in ("f32", "bf16")} <= set(signatures)
    assert "bf16_linear_amx" not in signatures  # below the Python section: a call between sources


def test_the_loaded_library_has_every_call_typed_from_the_header(cpu_kernels):
    for name, argtypes in kernel_abi.kernel_signatures().items():
        function = getattr(cpu_kernels.library, name)
        assert function.argtypes == argtypes and function.restype is ctypes.c_int, name


def test_a_parameter_type_without_a_ctypes_mapping_is_named(tmp_path):
    header = tmp_path / "hetero_kernels.h"
    header.write_text("int scale_rows(double factor, int num_threads);\n/* END OF THE PYTHON ABI */\n")
    with pytest.raises(ValueError, match=r"scale_rows's parameter 'double factor' has no ctypes type"):
        kernel_abi.kernel_signatures(header)
