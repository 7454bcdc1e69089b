"""`bench/cpu_vs_vllm.py` with an AVX2-only CPU emulated on an AVX-512 one (an approximation).

For sessions without an AVX2-only machine. Everything both engines run through torch is capped at
AVX2 before torch loads: torch's own kernels (ATEN_CPU_CAPABILITY=avx2), oneDNN
(ONEDNN_MAX_CPU_ISA=AVX2) and MKL (MKL_ENABLE_INSTRUCTIONS=AVX2), in this process and in vLLM's
worker, which inherits the environment; Hetero's C kernels are built with -march=haswell (AVX2 +
FMA) instead of -march=native. Not capped: vLLM's own C++ kernels (its attention may still use
AVX-512) and the machine itself (caches, memory, clocks), so the figures approximate an AVX2 CPU of
this micro-architecture, not the AVX2 VMs we also get. Hetero's dtype is float32, which `auto`
chooses on a CPU without native bf16; the peer is vLLM in float32 (its best configuration on such
a CPU: its bf16 is emulated there). Load to first token is not timed (the `hetero run` it starts
would build native kernels).

    .venv/bin/python bench/cpu_vs_vllm_avx2_emulated.py [hetero bench offline options, e.g. --rounds 5 --json out.json]
"""

import os
import sys

CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}

if __name__ == "__main__":
    if "torch" in sys.modules:
        raise SystemExit("torch is already loaded: the ISA caps must be set before it loads")
    os.environ.update(CAPS)
    from hetero_core.cli.main import main
    from hetero_core.model.cpu import kernels as cpu_kernels

    cpu_kernels.CFLAGS = tuple("-march=haswell" if flag == "-march=native" else flag for flag in cpu_kernels.CFLAGS)
    sys.exit(main(["bench", "offline", "--peers", "vllm-fp32", "--dtype", "float32", "--rounds", "3",
                   *sys.argv[1:]]))
