#!/usr/bin/env bash
# kvlane over ucx vs ucx_perftest put bandwidth: same transports, sizes,
# memory and footprint, same run. Prints one table with a ratio column
# (kvlane / ucx_perftest).
#
#   bench/ucx_compare.sh [BUILD_DIR] [TRANSPORTS...]
#
# BUILD_DIR defaults to ./build (it needs bench/ucx_bench and
# modules/libkvlane-ucx.so). TRANSPORTS are UCX_TLS values; "default" leaves
# UCX_TLS unset. Default list: tcp sm default. Sizes: 64 KiB, 1 MiB, 16 MiB.
#
# What each side does (docs/backends-ucx.md, "Performance"):
#   ucx_perftest -t ucp_put_bw -s SIZE -n ITERS: both sides allocate SIZE
#     bytes with ucp_mem_map(UCP_MEM_MAP_ALLOCATE); the sender calls
#     ucp_put_nbx of that buffer to the same remote address ITERS times
#     (no flush in between) and flushes the worker at the end.
#   ucx_bench -f same: each transfer lists the same SIZE block at the same
#     local and remote address BLOCKS times (32 MiB / SIZE: 512, 32, 2); two transfers stay posted; the ucx backend issues one
#     ucp_put_nbx per entry and one ucp_ep_flush_nbx per transfer (per 64 MiB
#     batch).
# Rows, per transport and size:
#   mem=ucx  UCX-allocated memory on both sides: perftest as is, kvlane
#            -a ucx (kvl_mem_alloc_ex backend "ucx": ucp_mem_map ALLOCATE).
#            On sm/default UCX allocates a sysv/posix segment and a put is a
#            copy into the peer's mapped segment.
#   mem=app  application (private) memory on both sides: perftest with
#            UCX_ALLOC_PRIO=mmap (UCX's allocation is then a private mmap,
#            like an application's buffer), kvlane -a app (mmap'ed buffers,
#            registered). UCX 1.13 does not put into such memory through cma:
#            it emulates the put with active messages over its sm (or tcp)
#            lanes and the target's progress copies the data in; perftest
#            cannot be made to use cma for put either (UCX_TLS=cma,tcp gives
#            tcp's numbers, on both sides).
# Extra column "spread": kvlane with UCX-allocated memory and the KV-like
# footprint (-f spread: 32 MiB of distinct blocks per transfer), for
# reference; it has no perftest counterpart.
# Both programs run with UCX_{SYSV,POSIX}_ERROR_HANDLING=y, as kvlane's peer
# error handling needs, so both select the same transports.
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

perftest_gbps() { # tls size mem
    local tls=$1 size=$2 mem=$3 iters out bytes prio=""
    # about 8 GB moved on shared memory, 0.4 GB on tcp; 50 to 200000 iterations
    bytes=8000000000; [ "$tls" = tcp ] && bytes=400000000
    iters=$(( bytes / size )); [ $iters -gt 200000 ] && iters=200000; [ $iters -lt 50 ] && iters=50
    [ "$mem" = app ] && prio=mmap
    port=$((port + 1))
    ( [ "$tls" = default ] || export UCX_TLS=$tls; [ -n "$prio" ] && export UCX_ALLOC_PRIO=$prio
      exec timeout 120 ucx_perftest -p $port ) >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    out=$( ( [ "$tls" = default ] || export UCX_TLS=$tls; [ -n "$prio" ] && export UCX_ALLOC_PRIO=$prio
             timeout 120 ucx_perftest 127.0.0.1 -p $port -t ucp_put_bw -s "$size" -n $iters ) 2>&1 )
    wait $srv 2>/dev/null
    # Final: iters lat(typ avg overall) bw(avg overall MB/s) rate(avg overall)
    echo "$out" | awk '/^Final:/ { printf "%.3f", $7 / 1000.0 * 1.048576 }'
}

kvlane_gbps() { # tls size alloc footprint
    local tls=$1 size=$2 alloc=$3 fp=$4
    ( [ "$tls" = default ] || export UCX_TLS=$tls
      KVL_MODULE_PATH="$build/modules" timeout 120 "$bench" -s "$size" -t "$secs" -a "$alloc" \
          -f "$fp" ) 2>&1 |
        awk '/^size/ { for (i = 1; i <= NF; i++) if ($i == "GB/s") print $(i + 1) }'
}

# Rounds: each row runs perftest and kvlane alternately ROUNDS times (this
# machine's noise is large); it prints the best of each, their ratio, and the
# median of the per-round ratios.
rounds=${KVL_UCX_ROUNDS:-3}
printf "%-9s %-6s %-4s %14s %12s %7s %12s %9s\n" transport size mem "perftest GB/s" "kvlane GB/s" \
    ratio "spread GB/s" "med.ratio"
for tls in "${tls_list[@]}"; do
    for size in 65536 1048576 16777216; do
        case $size in 65536) s=64KiB ;; 1048576) s=1MiB ;; *) s=16MiB ;; esac
        for mem in ucx app; do
            ps=() ks=()
            for ((i = 0; i < rounds; i++)); do
                ps+=("$(perftest_gbps "$tls" "$size" "$mem")")
                ks+=("$(kvlane_gbps "$tls" "$size" "$mem" same)")
            done
            sp=-
            [ "$mem" = ucx ] && sp=$(kvlane_gbps "$tls" "$size" ucx spread)
            read -r p k r mr < <(awk -v P="${ps[*]}" -v K="${ks[*]}" 'BEGIN {
                n = split(P, pa, " "); split(K, ka, " "); bp = 0; bk = 0; m = 0
                for (i = 1; i <= n; i++) {
                    if (pa[i] + 0 > bp) bp = pa[i] + 0
                    if (ka[i] + 0 > bk) bk = ka[i] + 0
                    if (pa[i] + 0 > 0) rr[++m] = (ka[i] + 0) / pa[i]
                }
                for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (rr[j] < rr[i]) { t = rr[i]; rr[i] = rr[j]; rr[j] = t }
                med = m ? (m % 2 ? rr[(m + 1) / 2] : (rr[m / 2] + rr[m / 2 + 1]) / 2) : 0
                if (bp > 0) printf "%.3f %.3f %.2f %.2f\n", bp, bk, bk / bp, med
                else printf "fail %.3f n/a n/a\n", bk }')
            printf "%-9s %-6s %-4s %14s %12s %7s %12s %9s\n" "$tls" "$s" "$mem" "$p" "$k" "$r" \
                "${sp:-fail}" "$mr"
        done
    done
done
