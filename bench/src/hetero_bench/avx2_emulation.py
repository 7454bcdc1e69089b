"""``hetero bench offline --emulate-avx2``: an AVX2-only CPU emulated on an AVX-512 one (an approximation).

For sessions without an AVX2-only machine. Everything both engines run through torch is capped at
AVX2 before torch loads: torch's own kernels (ATEN_CPU_CAPABILITY=avx2), oneDNN
(ONEDNN_MAX_CPU_ISA=AVX2) and MKL (MKL_ENABLE_INSTRUCTIONS=AVX2), in this process and in vLLM's
worker, which inherits the environment; Hetero's C kernels are built with -march=haswell (AVX2 +
FMA) instead of -march=native, through ``$CC`` (the compiler Hetero's docs name): a wrapper that
swaps the one flag and runs the real compiler. Not capped: vLLM's own C++ kernels (its attention may
still use AVX-512) and the machine itself (caches, memory, clocks), so the figures approximate an
AVX2 CPU of this micro-architecture, not the AVX2 VMs we also get. Give ``--dtype float32`` (what
`auto` chooses on a CPU without native bf16) and the vLLM peer in float32 (its best configuration
on such a CPU: its bf16 is emulated there).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from hetero_core import HeteroError

CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
WRAPPER = """#!/bin/sh
# hetero bench --emulate-avx2: Hetero's C kernels for AVX2 + FMA (haswell) instead of this CPU
for arg; do shift; [ "$arg" = "-march=native" ] && arg="-march=haswell"; set -- "$@" "$arg"; done
exec {compiler} "$@"
"""


def emulate_avx2() -> dict[str, str]:
    """Set the caps (and ``$CC``) in this process's environment; the variables set. Before torch loads."""
    if "torch" in sys.modules:
        raise HeteroError("--emulate-avx2: torch is already loaded; the ISA caps must be set before it loads")
    wrapper = Path(tempfile.gettempdir()) / "hetero-bench-avx2" / "cc"  # one path: one kernel cache entry
    compiler = os.environ.get("CC")
    if not compiler or compiler == str(wrapper):
        compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise HeteroError(
            "--emulate-avx2 builds the C kernels for AVX2, and no C compiler was found "
            "(install gcc, or set CC)"
        )
    text = WRAPPER.format(compiler=compiler)
    if not wrapper.is_file() or wrapper.read_text() != text:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(text)
        wrapper.chmod(0o755)
    variables = {**CAPS, "CC": str(wrapper)}
    os.environ.update(variables)
    return variables
