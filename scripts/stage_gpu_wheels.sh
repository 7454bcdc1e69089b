#!/usr/bin/env bash
# Stage the wheels scripts/gpu_check.sh installs on the GPU machine (issue 39; docs/benchmarks.md,
# "The one GPU check"): hetero-core's dependencies the GPU image lacks, and flash-attn-4 (CuTe DSL)
# with its dependency closure. That machine has CUDA 13, python3 3.12, torch 2.11, triton, numpy and
# einops, no network, and a run carries at most 64 MiB. This downloads the exact pinned wheels
# (CPython 3.12, manylinux x86_64) into .whl/, splits any wheel over 48 MiB into parts (the first
# stays in .whl/, the others go to .whl-2/), and prints which folder to carry in run 1 and in run 2.
# gpu_check.sh joins the parts and installs every wheel with --no-deps: nvidia-cutlass-dsl's
# unconditional -libs-cu12 requirement is not staged, its CUDA 13 libs wheel (-libs-cu13) is.
#
# Usage: scripts/stage_gpu_wheels.sh [--dir DIR] [--python-version X.Y]
#   --dir             where the wheels go (default .whl at the repository's root; git ignores it)
#   --python-version  the GPU machine's CPython (default 3.12) for the binary wheels' tags
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$(command -v python3 || command -v python)}
DIR=$ROOT/.whl
PYVER=3.12
while [[ $# -gt 0 ]]; do
    case $1 in
        --dir) DIR=$2; shift ;;
        --python-version) PYVER=$2; shift ;;
        *) echo "stage_gpu_wheels.sh: unknown option '$1'; options: --dir DIR, --python-version X.Y" >&2; exit 2 ;;
    esac
    shift
done
LIMIT=$((64 * 1024 * 1024))       # what one run carries
PART_BYTES=$((48 * 1024 * 1024))  # a larger wheel is split into parts of this size

# What the GPU image lacks: hetero-core's own dependencies (pydantic and its closure, structlog,
# gguf: pinned as in requirements.txt), then the closure of flash-attn-4 4.0.0b36's Requires-Dist.
# Pure-Python wheels (py3-none-any) first, then the binary ones (cp312, manylinux_2_24/2_28 x86_64).
PURE=(pydantic==2.14.3 pydantic-settings==2.16.3 structlog==26.1.0 python-dotenv==1.2.4 typing-inspection==0.4.5
      typing-extensions==4.16.0 annotated-types==0.8.0 gguf==0.19.0
      flash-attn-4==4.0.0b36 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1)
BINARY=(pydantic-core==2.50.4
        nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2
        torch-c-dlpack-ext==0.1.5)
mkdir -p "$DIR"
"$PY" -m pip download --quiet --no-deps --pre -d "$DIR" "${PURE[@]}"
platforms=()
for n in 17 24 27 28; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version "$PYVER" \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "$DIR" "${BINARY[@]}"

# Split what one run cannot carry: the first part stays in DIR (run 1), the others go to DIR-2
# (run 2); gpu_check.sh joins NAME.whl.part-* from both back into NAME.whl.
DIR2=$DIR-2
rm -rf "$DIR2"
for wheel in "$DIR"/*.whl; do
    if [[ $(stat -c %s "$wheel") -gt $PART_BYTES ]]; then
        rm -f "$wheel".part-*
        split -b "$PART_BYTES" "$wheel" "$wheel.part-"
        rm "$wheel"
        mkdir -p "$DIR2"
        for part in "$wheel".part-*; do
            [[ $part == *.part-aa ]] || mv "$part" "$DIR2/"
        done
    fi
done

# The carry plan. Sizes in MiB; each run carries at most 64.
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
plan() {  # FOLDER RUN: list the folder's files and its total; fail if one run cannot carry it
    local folder=$1 total=0 size file
    for file in "$folder"/*; do
        size=$(stat -c %s "$file"); total=$((total + size))
        echo "  $(mib "$size") MiB  ${file#"$ROOT"/}"
    done
    echo "run $2 carries '${folder#"$ROOT"/}': $(mib $total) MiB"
    if [[ $total -gt $LIMIT ]]; then
        echo "stage_gpu_wheels.sh: '${folder#"$ROOT"/}' is over the 64 MiB a run carries; lower PART_BYTES" >&2
        exit 1
    fi
}
plan "$DIR" 1
if [[ -d $DIR2 ]]; then
    plan "$DIR2" 2
    echo "carry '${DIR#"$ROOT"/}' in run 1 (any quick command), then within ~30 s (the machine still warm," \
         "run 1's folder still there) '${DIR2#"$ROOT"/}' in run 2, which runs scripts/gpu_check.sh"
else
    echo "carry '${DIR#"$ROOT"/}' in the run of scripts/gpu_check.sh"
fi
