#!/usr/bin/env bash
# The cuda backend's GPU suite, for the GPU machine (the `device` tool):
# configure with the gather kernel for sm_90, build the cuda tests and the
# benchmark, run them; logs under $OUT (or ./gpu-out).
#   bash tests/gpu/run_gpu_suite.sh [build dir]
# The ucx module (and so test_ucx_vram) needs UCX's headers: see
# tests/gpu/carry_ucx_headers.sh.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bld=${1:-$src/build-gpu}
out=${OUT:-$src/gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
targets="test_cuda_nodriver test_cuda_gpu test_cuda_multigpu test_tcp_vram test_ucx_vram test_posix_vram test_posix_gds test_contract bench_cuda_bench"
build() {
    cmake -S "$src" -B "$bld" -DKVL_CUDA_ARCHS=90 -DKVL_SANITIZER_TESTS=OFF -DKVL_FUZZ=OFF \
        >"$out/configure.log" 2>&1 || return 1
    # the ucx module when UCX's headers are there (test_ucx_vram skips without)
    grep -q "ucx backend module with UCX" "$out/configure.log" && targets="$targets kvlane_ucx"
    cmake --build "$bld" -j"$(nproc)" --target $targets >"$out/build.log" 2>&1
}
if ! build; then
    echo "build failed; tail of the log:"; tail -20 "$out/build.log"
    exit 1
fi
grep -E 'cuda gather kernel|no nvcc' "$out/configure.log"
echo "== test_cuda_nodriver"; (cd "$bld" && ./tests/test_cuda_nodriver) 2>&1 | tee "$out/nodriver.log" | tail -3
echo "== test_cuda_gpu"; (cd "$bld" && timeout 400 ./tests/test_cuda_gpu) >"$out/gpu_test.log" 2>&1
echo "rc=$?"; cat "$out/gpu_test.log" | cut -c1-300 | tail -120
echo "== test_cuda_multigpu"; (cd "$bld" && timeout 300 ./tests/test_cuda_multigpu) >"$out/multigpu.log" 2>&1
rc=$?; echo "rc=$rc"; cut -c1-300 "$out/multigpu.log" | tail -40
if [ $rc -eq 77 ]; then
    echo "== test_cuda_multigpu --same-device (dry run of the test on one GPU)"
    (cd "$bld" && timeout 300 ./tests/test_cuda_multigpu --same-device) >"$out/multigpu_dry.log" 2>&1
    echo "rc=$?"; cut -c1-300 "$out/multigpu_dry.log" | tail -40
fi
echo "== test_tcp_vram"; (cd "$bld" && timeout 300 ./tests/test_tcp_vram) >"$out/tcp_vram.log" 2>&1
echo "rc=$?"; cut -c1-300 "$out/tcp_vram.log" | tail -60
echo "== test_posix_vram"; (cd "$bld" && timeout 300 ./tests/test_posix_vram) >"$out/posix_vram.log" 2>&1
echo "rc=$?"; cut -c1-300 "$out/posix_vram.log" | tail -40
# GPUDirect Storage (cuFile): KVL_GDS_DIR picks the file system (default TMPDIR or /tmp);
# libcufile from the loader's path, else pip's nvidia-cufile wheel or a CUDA install
if [ -z "${KVL_CUFILE:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcufile\.so'; then
    sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
    cf=$(find $sp /usr/local/cuda*/ -name 'libcufile.so.0' 2>/dev/null | head -1)
    [ -n "$cf" ] && export KVL_CUFILE=$cf
fi
echo "KVL_CUFILE=${KVL_CUFILE:-(unset: libcufile.so.0 from the loader path)}"
echo "== test_posix_gds"; (cd "$bld" && timeout 300 ./tests/test_posix_gds) >"$out/posix_gds.log" 2>&1
echo "rc=$?"; cut -c1-600 "$out/posix_gds.log" | tail -40
echo "== test_ucx_vram"; (cd "$bld" && timeout 300 ./tests/test_ucx_vram) >"$out/ucx_vram.log" 2>&1
echo "rc=$?"; cut -c1-300 "$out/ucx_vram.log" | tail -60
echo "== test_contract (the cuda row runs here)"; (cd "$bld" && timeout 300 ./tests/test_contract) >"$out/contract.log" 2>&1
echo "rc=$?"; grep -E "cuda|summary|passed|failed" "$out/contract.log" | cut -c1-200 | tail -30
[ -n "${KVL_GPU_ONLY:-}" ] && exit 0
echo "== cuda_bench"; (cd "$bld" && timeout 200 ./bench/cuda_bench 20) 2>&1 | tee "$out/bench.log"
echo "== cuda_bench --peer-dev 1 (across GPUs; skips on one)"
(cd "$bld" && timeout 200 ./bench/cuda_bench 20 --peer-dev 1) 2>&1 | tee "$out/bench_peer.log"
