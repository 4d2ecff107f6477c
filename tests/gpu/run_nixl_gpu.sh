#!/usr/bin/env bash
# kvlane.nixl on the GPU machine: build the library and Python module for
# sm_90, run each engine's call sequence with VRAM tensors through the nixl
# package (they must take the cuda backend), then bench/nixl_vram.py.
#   bash tests/gpu/run_nixl_gpu.sh [build dir]
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bld=${1:-$src/build-gpu}
out=${OUT:-$src/gpu-out}
mkdir -p "$out"
py=$(command -v python3)
cmake -S "$src" -B "$bld" -DKVL_CUDA_ARCHS=90 -DKVL_SANITIZER_TESTS=OFF -DKVL_FUZZ=OFF \
    -DPython3_EXECUTABLE="$py" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$bld" -j"$(nproc)" --target kvlane_python >"$out/build_py.log" 2>&1 ||
    { tail -30 "$out/build_py.log"; exit 1; }
export KVL_NIXL_PATH="$bld/python-nixl" KVL_BUILD="$bld"
echo "== engines through nixl._api, VRAM"
timeout 300 "$py" "$src/tests/python/test_nixl_engines.py" VRAM DRAM 2>&1 | tee "$out/engines.log"
echo "rc=${PIPESTATUS[0]}"
echo "== bench/nixl_vram.py"
PYTHONPATH="$bld/python-nixl" timeout 300 "$py" "$src/bench/nixl_vram.py" --reps 10 2>&1 | tee "$out/nixl_vram.log"
echo "rc=${PIPESTATUS[0]}"
