#!/usr/bin/env bash
# The one GPU check (issue 25; docs/benchmarks.md, "The one GPU check"). On one H100/H200 with no
# network, in under 5 minutes:
#   1. the Python packages the GPU image lacks, from the wheels carried in .whl and .whl-2
#      (scripts/stage_gpu_wheels.sh stages them; a wheel split in parts is joined first; pip --no-index,
#      into a private directory; plain unzip where pip is missing), the plugins' entry points likewise;
#      the repo's code runs from PYTHONPATH; then flash-attn (2.x or flash-attn-4) must load through the
#      cuda plugin's loader, or the check stops with one line (--dry-run: reported, not required);
#   2. the GPU tests: tests/cuda, tests/triton (compiled on the GPU), the torch executor on CUDA, the
#      step-input and decode-graph tests, and greedy equality of torch / triton / cuda;
#   3. nano-vllm's workload (256 requests, prompt and output lengths uniform in 100-1024, seed 0,
#      Qwen3-0.6B shape with random bf16 weights) on each GPU executor: tok/s, and host, device and
#      wait time per step (`python -m hetero_core bench gpu-offline`).
# Everything it prints also goes to $OUT (default ./gpu_check_out): summary.txt, tests.txt, one
# <executor>.txt and <executor>.json per run.
#
# Usage: scripts/gpu_check.sh [--dry-run] [--budget SECONDS] [--wheels DIR]
#   --dry-run     no GPU needed: a few CPU-runnable tests and a tiny-model run of triton (in its
#                 interpreter) and torch, to check the script itself
#   --budget      seconds for the whole check (default 280); each phase gets a share and is cut off
#                 (and says so) rather than overrun
#   --wheels      the carried wheels (default .whl at the repository's root; DIR-2 holds the parts of
#                 split wheels that a second carry brought)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-$(command -v python3 || command -v python)}
DRY=0
BUDGET=280
WHEELS=$ROOT/.whl
while [[ $# -gt 0 ]]; do
    case $1 in
        --dry-run) DRY=1 ;;
        --budget) BUDGET=$2; shift ;;
        --wheels) WHEELS=$2; shift ;;
        *) echo "gpu_check.sh: unknown option '$1'; options: --dry-run, --budget SECONDS, --wheels DIR" >&2; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
START=$SECONDS
say() { echo "[gpu_check +$((SECONDS - START))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((BUDGET - (SECONDS - START))); }

# 1. Packages: every carried wheel into a private directory first on the path (the image's own
#    typing_extensions may be older than pydantic needs). --target skips pip's PEP 668 refusal.
SITE=${TMPDIR:-/tmp}/hetero-gpu-check-site
JOINED=${TMPDIR:-/tmp}/hetero-gpu-check-wheels  # wheels joined from their parts
rm -rf "$SITE" "$JOINED"
mkdir -p "$JOINED"
shopt -s nullglob
for first in "$WHEELS"/*.whl.part-aa; do  # NAME.whl.part-aa here, the later parts here or in $WHEELS-2
    name=$(basename "${first%.part-aa}")
    parts=("$WHEELS/$name".part-* "$WHEELS-2/$name".part-*)
    mapfile -t parts < <(for part in "${parts[@]}"; do echo "${part##*.part-} $part"; done | sort | cut -d' ' -f2-)
    cat "${parts[@]}" > "$JOINED/$name"
    if ! $PY -c "import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)" \
            "$JOINED/$name" 2> /dev/null; then
        say "$name is incomplete (${#parts[@]} parts found): carry $WHEELS-2 too (scripts/stage_gpu_wheels.sh prints the plan)"
        exit 1
    fi
done
wheels=("$WHEELS"/*.whl "$JOINED"/*.whl)
shopt -u nullglob
if [[ ${#wheels[@]} -gt 0 ]]; then
    mkdir -p "$SITE"
    if $PY -m pip --version > /dev/null 2>&1; then  # one call: wheels sharing a namespace folder (cuda/) merge
        $PY -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" \
            "${wheels[@]}" > "$OUT/pip.txt" 2>&1 || say "pip install failed (see pip.txt); unzipping instead"
    fi
    if ! ls "$SITE"/*.dist-info > /dev/null 2>&1; then  # no pip, or it failed: a wheel is a zip of its files
        $PY -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" \
            "$SITE" "${wheels[@]}"
    fi
    say "installed ${#wheels[@]} wheels from $WHEELS into $SITE"
else
    say "no wheels in $WHEELS: using the packages installed here"
fi
# The repository's plugin packages: only their metadata matters (the entry points of the triton and
# cuda executors and of `hetero bench`); the code runs from the checkout, first on the path.
mkdir -p "$SITE"
if ! $PY -m pip install --quiet --no-index --no-deps --no-build-isolation --disable-pip-version-check \
        --target "$SITE" ./hetero_plugins_triton ./hetero_plugins_cuda ./bench > "$OUT/pip-repo.txt" 2>&1; then
    say "pip could not build the repository's packages (pip-repo.txt): writing their entry points by hand"
    $PY - "$SITE" << 'EOF'
import pathlib, sys, tomllib
site = pathlib.Path(sys.argv[1])
for folder in ("hetero_plugins_triton", "hetero_plugins_cuda", "bench"):
    project = tomllib.loads(pathlib.Path(folder, "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items()) + "\n"
        for group, points in groups.items()))
EOF
fi
# --target runs no .pth file: nvidia-cutlass-dsl's (flash-attn-4's CuTe DSL) puts this folder on the path.
DSL=$SITE/nvidia_cutlass_dsl/dsl_packages
[[ -d $DSL ]] || DSL=""
export PYTHONPATH=$ROOT/core/src:$ROOT/hetero_plugins_mock/src:$ROOT/hetero_plugins_triton/src:$ROOT/hetero_plugins_cuda/src:$ROOT/bench/src:$ROOT/plugins/hetero-policy-fair-share/src:$ROOT/plugins/hetero-model-phi3/src:$SITE${DSL:+:$DSL}${PYTHONPATH:+:$PYTHONPATH}
export HETERO_CACHE_DIR=${HETERO_CACHE_DIR:-${TMPDIR:-/tmp}/hetero-gpu-check-cache}
$PY - << 'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import importlib.util, platform
needed = ("torch", "pluggy", "numpy", "safetensors", "tokenizers", "transformers", "pytest")
missing = [name for name in needed if importlib.util.find_spec(name) is None]
if missing:
    print(f"missing here and not among the carried wheels: {', '.join(missing)} "
          "(tests and runs that need them will fail or skip)")
import torch
import hetero_core, pydantic, pydantic_settings, structlog
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = None
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print(f"python {platform.python_version()}, torch {torch.__version__}, triton {triton_version}, "
      f"pydantic {pydantic.VERSION}, gpu {gpu}, hetero_core from {hetero_core.__file__}")
EOF
[[ ${PIPESTATUS[0]} -eq 0 ]] || { say "the packages do not import (above): stopping"; exit 1; }

# flash-attn through the cuda plugin's own loader: its name and the block size its fast path takes.
FA_BLOCK=""
if FA=$($PY -c "from hetero_plugins_cuda.loader import load_flash_attn
k = load_flash_attn()
print(k.fast_block_size or k.page_block_multiple, k.name)" 2> "$OUT/flash_attn.txt"); then
    FA_BLOCK=${FA%% *}
    say "attention kernels: ${FA#* } (cuda runs with block_size $FA_BLOCK)"
elif [[ $DRY -eq 1 ]]; then
    say "flash-attn does not load here (flash_attn.txt); --dry-run does not need it"
else
    say "flash-attn does not load: $(grep -v '^ ' "$OUT/flash_attn.txt" | tail -n 1); stage it with scripts/stage_gpu_wheels.sh and carry .whl (and .whl-2)"
    exit 1
fi

# 2. The GPU tests (on a CPU machine: the same files, GPU-only tests skip themselves).
TESTS=(tests/triton/test_gpu_executors_agree.py tests/cuda/test_cuda_gpu.py tests/model/test_torch_executor_cuda.py
       tests/triton/test_triton_engine.py tests/model/test_step_inputs.py tests/model/test_decode_graphs.py
       tests/speculative/test_draft_device.py
       tests/cuda tests/triton)  # the GPU-only files first: a cut-off budget loses the rest
[[ $DRY -eq 1 ]] && TESTS=(tests/model/test_step_inputs.py tests/model/test_decode_graphs.py
                           tests/triton/test_gpu_executors_agree.py)  # the interpreter is slow: a few
TEST_S=$(( $(left) * 45 / 100 ))
say "tests (${TEST_S}s at most): ${TESTS[*]}"
if [[ $TEST_S -gt 0 ]]; then
    # "not slow": the hand-marked slow tests only (the folder rules of tests/tiers.py would take them all)
    TEST_TIERS_BY_HAND=1 timeout "$TEST_S" $PY -m pytest -p no:cacheprovider -q -m "not slow" "${TESTS[@]}" \
        > "$OUT/tests.txt" 2>&1
    status=$?
else
    echo "no time left for the tests" > "$OUT/tests.txt"
    status=124
fi
tail -n 25 "$OUT/tests.txt"; echo
case $status in
    0) say "tests passed" ;;
    124) say "tests CUT OFF at ${TEST_S}s (tests.txt has what ran)" ;;
    *) say "tests FAILED (exit $status; tests.txt)" ;;
esac

# 3. nano-vllm's workload per GPU executor (--dry-run: the tiny model on the CPU).
RUNS=("triton" "cuda --block-size $FA_BLOCK" "torch")  # torch: its default, eager (cuda_graphs: see benchmarks.md)
EXTRA=()
if [[ $DRY -eq 1 ]]; then  # cuda's start-up needs CUDA: its CPU checks are the tests on the double
    RUNS=("triton" "torch")
    EXTRA=(--dry-run --model-dir "${TMPDIR:-/tmp}/hetero-gpu-check-model")
fi
for i in "${!RUNS[@]}"; do
    run=${RUNS[$i]}
    name=${run%% *}
    share=$(( $(left) / (${#RUNS[@]} - i) ))
    if [[ $share -lt 20 ]]; then
        say "$name: skipped, ${share}s left"
        continue
    fi
    say "$name: gpu-offline --executor $run (${share}s at most)"
    # shellcheck disable=SC2086 # $run holds the executor and its flags
    timeout "$share" $PY -m hetero_core bench gpu-offline --executor $run "${EXTRA[@]}" --json "$OUT/$name.json" \
        > "$OUT/$name.txt" 2>&1
    status=$?
    grep -E "^(device|workload|executor|$name)" "$OUT/$name.txt" | tee -a "$OUT/summary.txt"
    grep -h "capture_failed" "$OUT/$name.txt" | tee -a "$OUT/summary.txt"  # graphs fell back to eager
    case $status in
        0) ;;
        124) say "$name: CUT OFF at ${share}s" ;;
        *) say "$name: FAILED (exit $status)"; tail -n 15 "$OUT/$name.txt" ;;
    esac
done
say "done in $((SECONDS - START))s; results in $OUT"
