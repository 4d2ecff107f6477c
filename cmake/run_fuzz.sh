#!/usr/bin/env bash
# Build every tests/fuzz/fuzz_*.c as a libFuzzer target (clang,
# -fsanitize=fuzzer,address,undefined) together with the library sources
# (not the CLI) and run each for KVL_FUZZ_SECONDS (default 30) seconds.
# Registered by cmake/KvlTests.cmake as the test fuzz_metadata.
#
# usage: run_fuzz.sh SOURCE_DIR WORK_DIR
#   WORK_DIR/lib_sources.txt   library sources, one a line (written by CMake)
#   WORK_DIR/lib_cflags.txt    their defines and include flags, one a line
#   WORK_DIR/lib_libs.txt      the libraries they need (etcd store, liburing)
#   WORK_DIR/<target>          fuzzer binaries
#   WORK_DIR/corpus/<target>/  corpus, seeded from tests/fuzz/corpus/<target>/
#   WORK_DIR/artifacts/        crashing inputs; WORK_DIR/logs/ full output
# Reproduce a crash: WORK_DIR/<target> WORK_DIR/artifacts/<target>-crash-...
# Exit 77 (skip) with the reason when clang or libFuzzer is missing.
set -euo pipefail

src=${1:?usage: run_fuzz.sh SOURCE_DIR WORK_DIR}
work=${2:?work dir}
secs=${KVL_FUZZ_SECONDS:-30}

skip() { echo "SKIP: fuzz: $*"; exit 77; }

cc=${KVL_CLANG:-}
if [ -z "$cc" ] || [ ! -x "$cc" ]; then
    cc=$(command -v clang || command -v clang-14 || true)
fi
[ -n "$cc" ] || skip "clang not found (./scripts/deps.sh installs clang and libclang-rt-14-dev)"

shopt -s nullglob
targets=("$src"/tests/fuzz/fuzz_*.c)
shopt -u nullglob
[ "${#targets[@]}" -gt 0 ] || skip "no fuzz targets (tests/fuzz/fuzz_*.c)"

mkdir -p "$work/obj" "$work/corpus" "$work/artifacts" "$work/logs"

# ---- probe libFuzzer's runtime
cat >"$work/probe.c" <<'PROBE'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    return 0;
}
PROBE
if ! "$cc" -fsanitize=fuzzer,address,undefined "$work/probe.c" -o "$work/probe" \
        >"$work/logs/probe.log" 2>&1; then
    cat "$work/logs/probe.log"
    skip "clang cannot link -fsanitize=fuzzer (libFuzzer runtime missing: apt-get install libclang-rt-14-dev)"
fi
if ! "$work/probe" -runs=10 >>"$work/logs/probe.log" 2>&1; then
    cat "$work/logs/probe.log"
    skip "a libFuzzer binary does not run on this machine"
fi

warn=(-Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
      -Wpointer-arith -Wformat=2 -Wvla -Wundef)
[ "${KVL_WERROR:-ON}" = OFF ] || warn+=(-Werror)
cflags=(-std=c11 -g -O1 -fno-omit-frame-pointer -fno-sanitize-recover=all
        -D_GNU_SOURCE= -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
        -I"$src/include" -I"$src/src" "${warn[@]}")

# ---- library objects, instrumented once for all targets
libsrcs=()
if [ -f "$work/lib_sources.txt" ]; then
    while IFS= read -r line; do
        [ -n "$line" ] && libsrcs+=("$line")
    done <"$work/lib_sources.txt"
fi
[ "${#libsrcs[@]}" -gt 0 ] || { echo "FAIL: $work/lib_sources.txt lists no library sources"; exit 1; }
# the optional parts the build has (etcd store, liburing): their flags and libraries
libcflags=()
liblibs=()
if [ -f "$work/lib_cflags.txt" ]; then
    while IFS= read -r line; do
        [ -n "$line" ] && libcflags+=("$line")
    done <"$work/lib_cflags.txt"
fi
if [ -f "$work/lib_libs.txt" ]; then
    while IFS= read -r line; do
        [ -n "$line" ] && liblibs+=("$line")
    done <"$work/lib_libs.txt"
fi

objs=()
for s in "${libsrcs[@]}"; do
    rel=${s#"$src"/}
    o="$work/obj/${rel//\//_}.o"
    "$cc" "${cflags[@]}" "${libcflags[@]}" -fsanitize=fuzzer-no-link,address,undefined -c "$s" \
        -o "$o"
    objs+=("$o")
done

# ---- build and run every target
failed=()
for t in "${targets[@]}"; do
    name=$(basename "$t" .c)
    "$cc" "${cflags[@]}" "${libcflags[@]}" -fsanitize=fuzzer,address,undefined "$t" "${objs[@]}" \
        "${liblibs[@]}" -pthread -ldl -lcrypto -o "$work/$name"
    corpus="$work/corpus/$name"
    mkdir -p "$corpus"
    if [ -d "$src/tests/fuzz/corpus/$name" ]; then
        cp -rn "$src/tests/fuzz/corpus/$name"/. "$corpus"/
    fi
    echo "== $name: fuzzing for ${secs}s (corpus $corpus: $(ls "$corpus" | wc -l) inputs)"
    if "$work/$name" -max_total_time="$secs" -timeout=25 -print_final_stats=1 \
            -artifact_prefix="$work/artifacts/$name-" "$corpus" \
            >"$work/logs/$name.log" 2>&1; then
        grep -E '^(stat::number_of_executed_units|stat::new_units_added|Done)' \
            "$work/logs/$name.log" || true
    else
        echo "FAIL: $name (log $work/logs/$name.log):"
        tail -n 60 "$work/logs/$name.log"
        failed+=("$name")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}; crashing inputs in $work/artifacts/"
    exit 1
fi
echo "fuzz: ${#targets[@]} target(s) ran ${secs}s each without a failure"
