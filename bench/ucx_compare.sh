#!/usr/bin/env bash
# kvlane over ucx vs ucx_perftest put bandwidth, same transports, same sizes,
# same run. Prints one table with a ratio column (kvlane / ucx_perftest).
#
#   bench/ucx_compare.sh [BUILD_DIR] [TRANSPORTS...]
#
# BUILD_DIR defaults to ./build (it needs bench/ucx_bench and
# modules/libkvlane-ucx.so). TRANSPORTS are UCX_TLS values; "default" leaves
# UCX_TLS unset. Default list: tcp sm default. Sizes: 64 KiB, 1 MiB, 16 MiB.
# Both programs run with the shared-memory transports' error handling
# exposed (UCX_{SYSV,POSIX}_ERROR_HANDLING=y), as kvlane's peer error
# handling needs, so both select the same transports.
#
# Note: ucx_perftest puts into memory UCX allocated itself (ucp_mem_map
# ALLOCATE); on "sm"/"default" UCX can then map the target's buffer and
# copy directly, while kvlane registers memory the application owns, which
# UCX reaches through cross-memory attach (cma). tcp is like for like.
set -uo pipefail
build=${1:-build}
shift || true
tls_list=("$@")
[ ${#tls_list[@]} -eq 0 ] && tls_list=(tcp sm default)
bench="$build/bench/ucx_bench"
secs=${KVL_BENCH_SECONDS:-1.5}
port=${KVL_PERFTEST_PORT:-13371}
command -v ucx_perftest >/dev/null || { echo "SKIP: ucx_perftest not found (Debian: ucx-utils)"; exit 77; }
[ -x "$bench" ] || { echo "SKIP: $bench not built"; exit 77; }
export UCX_SYSV_ERROR_HANDLING=${UCX_SYSV_ERROR_HANDLING:-y}
export UCX_POSIX_ERROR_HANDLING=${UCX_POSIX_ERROR_HANDLING:-y}

perftest_gbps() { # tls size
    local tls=$1 size=$2 iters out
    # about 2 GB moved, at least 50 iterations (tcp is slow: a tenth)
    iters=$(( 2000000000 / size )); [ $iters -gt 20000 ] && iters=20000; [ $iters -lt 50 ] && iters=50
    [ "$tls" = tcp ] && iters=$(( iters / 10 + 20 ))
    port=$((port + 1))
    ( [ "$tls" = default ] || export UCX_TLS=$tls; exec timeout 120 ucx_perftest -p $port ) >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    out=$( ( [ "$tls" = default ] || export UCX_TLS=$tls
             timeout 120 ucx_perftest 127.0.0.1 -p $port -t ucp_put_bw -s "$size" -n $iters ) 2>&1 )
    wait $srv 2>/dev/null
    # Final: iters lat(typ avg overall) bw(avg overall MB/s) rate(avg overall)
    echo "$out" | awk '/^Final:/ { printf "%.3f", $7 / 1000.0 * 1.048576 }'
}

kvlane_gbps() { # tls size
    local tls=$1 size=$2
    ( [ "$tls" = default ] || export UCX_TLS=$tls
      KVL_MODULE_PATH="$build/modules" timeout 120 "$bench" -s "$size" -t "$secs" ) 2>&1 |
        awk '/^size/ { for (i = 1; i <= NF; i++) if ($i == "GB/s") print $(i + 1) }'
}

printf "%-9s %-8s %14s %14s %7s\n" transport size "perftest GB/s" "kvlane GB/s" ratio
for tls in "${tls_list[@]}"; do
    for size in 65536 1048576 16777216; do
        p=$(perftest_gbps "$tls" "$size")
        k=$(kvlane_gbps "$tls" "$size")
        r=$(awk -v p="${p:-0}" -v k="${k:-0}" 'BEGIN { if (p > 0) printf "%.2f", k / p; else print "n/a" }')
        case $size in 65536) s=64KiB ;; 1048576) s=1MiB ;; *) s=16MiB ;; esac
        printf "%-9s %-8s %14s %14s %7s\n" "$tls" "$s" "${p:-fail}" "${k:-fail}" "$r"
    done
done
