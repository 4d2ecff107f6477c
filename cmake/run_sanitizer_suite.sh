#!/usr/bin/env bash
# Build kvlane a second time with clang and sanitizers, then run its tests.
# Registered by cmake/KvlTests.cmake as the tests asan_ubsan_suite and tsan_suite.
#
# usage: run_sanitizer_suite.sh asan|tsan SOURCE_DIR BUILD_DIR
#   asan: -DKVL_SANITIZE=address,undefined, every test except those labelled
#         fuzz or nosan
#   tsan: -DKVL_SANITIZE=thread, only tests labelled tsan (and not nosan)
# Environment (set by CTest): KVL_CLANG, KVL_CMAKE, KVL_CTEST, KVL_WERROR.
# Exit 77 (skip) with the reason when clang or a sanitizer runtime is missing,
# or when no test is selected.
set -euo pipefail

suite=${1:?usage: run_sanitizer_suite.sh asan|tsan SOURCE_DIR BUILD_DIR}
src=${2:?source dir}
bdir=${3:?build dir}
cmake=${KVL_CMAKE:-cmake}
ctest=${KVL_CTEST:-ctest}

skip() { echo "SKIP: ${suite} sanitizer suite: $*"; exit 77; }

cc=${KVL_CLANG:-}
if [ -z "$cc" ] || [ ! -x "$cc" ]; then
    cc=$(command -v clang || command -v clang-14 || true)
fi
[ -n "$cc" ] || skip "clang not found (./scripts/deps.sh installs clang and libclang-rt-14-dev)"

case $suite in
asan)
    san=address,undefined
    select=(-LE '^(fuzz|nosan)$')
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
    # LeakSanitizer (clang 14) crashed scanning thread-local storage at the
    # exit of forked children that had loaded the ucx module ("Tracer caught
    # signal 11" in ScanRangeForPointers), depending on where the module's
    # code happened to lie. TLS is not scanned for roots; heap, globals,
    # stacks and registers are. What only TLS points to is glibc's dlerror
    # buffer (cmake/lsan.supp).
    export LSAN_OPTIONS=use_tls=0:suppressions=$src/cmake/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
tsan)
    san=thread
    select=(-L '^tsan$' -LE '^(fuzz|nosan)$')
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
    ;;
*)
    echo "run_sanitizer_suite.sh: unknown suite '$suite' (asan|tsan)" >&2
    exit 2
    ;;
esac

# ---- probe: does clang have this runtime, and does it work on this kernel?
probe_dir="$bdir/probe"
mkdir -p "$probe_dir"
cat >"$probe_dir/probe.c" <<'PROBE'
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
void *volatile probe_sink;
static void *run(void *arg) { return arg; }
__attribute__((noinline)) static void leak(void)
{
    probe_sink = malloc(64);      /* unreachable once the sink is cleared */
    memset(probe_sink, 1, 64);
    probe_sink = NULL;
}
int main(int argc, char **argv)
{
    pthread_t t;
    (void)argv;
    if (pthread_create(&t, NULL, run, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 2;
    if (argc > 1)                 /* "leak": check that LeakSanitizer works */
        leak();
    return 0;
}
PROBE
if ! "$cc" -g -fsanitize="$san" -fno-omit-frame-pointer -pthread \
        "$probe_dir/probe.c" -o "$probe_dir/probe" >"$probe_dir/compile.log" 2>&1; then
    cat "$probe_dir/compile.log"
    skip "clang cannot build with -fsanitize=$san (is libclang-rt-14-dev installed?)"
fi

runner=()
if ! "$probe_dir/probe" >"$probe_dir/run.log" 2>&1; then
    # Old TSan/ASan runtimes (clang 14) can fail with high-entropy ASLR
    # ("unexpected memory mapping"); running without ASLR works around it.
    if command -v setarch >/dev/null 2>&1 &&
       setarch "$(uname -m)" -R "$probe_dir/probe" >"$probe_dir/run.log" 2>&1; then
        echo "note: $san runtime needs ASLR off here; running the suite under setarch -R"
        runner=(setarch "$(uname -m)" -R)
    else
        cat "$probe_dir/run.log"
        skip "a program built with -fsanitize=$san does not run on this machine"
    fi
fi

if [ "$suite" = asan ]; then
    # LeakSanitizer needs ptrace-like access; some containers forbid it.
    out=$("${runner[@]}" "$probe_dir/probe" leak 2>&1 || true)
    if ! grep -q "detected memory leaks" <<<"$out"; then
        echo "$out"
        echo "WARNING: LeakSanitizer does not work here; running with detect_leaks=0"
        export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0
    fi
fi

# ---- configure, select, build, run
echo "== configuring $bdir (clang, KVL_SANITIZE=$san)"
"$cmake" -S "$src" -B "$bdir" \
    -DCMAKE_C_COMPILER="$cc" \
    -DKVL_SANITIZE="$san" \
    -DKVL_SANITIZER_TESTS=OFF \
    -DKVL_FUZZ=OFF \
    -DKVL_WERROR="${KVL_WERROR:-ON}" >"$bdir.configure.log" 2>&1 || {
    cat "$bdir.configure.log"
    echo "FAIL: configuring the $suite build failed"
    exit 1
}

ntests=$("$ctest" --test-dir "$bdir" -N "${select[@]}" | sed -n 's/^Total Tests: *//p')
if [ "${ntests:-0}" -eq 0 ]; then
    if [ "$suite" = tsan ]; then
        skip "no test is labelled tsan (name a test *_mt* or *concurrency*, or mark it KVL_TEST_LABELS: tsan)"
    fi
    skip "no test selected"
fi

echo "== building $bdir"
"$cmake" --build "$bdir" -j "$(nproc 2>/dev/null || echo 2)"

echo "== running $ntests tests (${select[*]}) ASAN_OPTIONS=${ASAN_OPTIONS:-} UBSAN_OPTIONS=${UBSAN_OPTIONS:-} TSAN_OPTIONS=${TSAN_OPTIONS:-}"
"${runner[@]}" "$ctest" --test-dir "$bdir" --output-on-failure "${select[@]}"
