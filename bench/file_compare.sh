#!/usr/bin/env bash
# kvlane's posix backend side by side with fio (io_uring engine) in one run:
# the same directory (one file system), block size, queue depth and O_DIRECT.
#
#   1. sequential DRAM -> file and file -> DRAM, 256 KiB .. 4 MiB blocks
#      (fio --rw=write / --rw=read, --bs, --iodepth=QD; kvlane bench
#      --backend posix --pattern contiguous)
#   2. 16 KiB scattered KV blocks, 4096 per transfer (fio --rw=randwrite /
#      randread at 16k; kvlane --pattern random --count 4096), from distinct
#      memory blocks and from QD reused ones (fio's footprint: --buffers QD)
#
# Usage: bench/file_compare.sh [DIR] (default $TMPDIR or /tmp)
#   env: KVL_BIN (kvlane CLI, default build/kvlane), QD (64), SIZE (256M per
#   transfer / fio job), ITERS (3 fio loops per measurement; kvlane moves
#   the same bytes: 3 transfers of SIZE, or 6 of the 64 MiB random ones),
#   ROUNDS (3: fio and kvlane alternate, the median of each is printed),
#   BUFFERED=1 for page-cache I/O on both.
# Both run on the same file: fio lays it out with data (so reads read written
# blocks and writes overwrite), then kvlane bench --file uses that file as
# is. (A file made fresh for each kvlane run measured 20-30% slower on this
# VM's virtual disk for random writes than the file fio had already
# written, while fio reused its own: not the same disk state.)
# Prints one table: each row kvlane GB/s, fio GB/s and the ratio.
set -euo pipefail
dir=${1:-${TMPDIR:-/tmp}}
here=$(cd "$(dirname "$0")/.." && pwd)
kvl=${KVL_BIN:-$here/build/kvlane}
qd=${QD:-64}
size=${SIZE:-256M}
iters=${ITERS:-3}
rounds=${ROUNDS:-3}
direct=1; kdirect=()
if [ "${BUFFERED:-0}" = 1 ]; then direct=0; kdirect=(--buffered); fi
command -v fio >/dev/null || { echo "fio not found (apt-get install fio; scripts/deps.sh)"; exit 77; }
[ -x "$kvl" ] || { echo "kvlane CLI not found at $kvl (build first, or set KVL_BIN)"; exit 2; }
work=$(mktemp -d "$dir/kvl-fio-XXXXXX")
trap 'rm -rf "$work"' EXIT

# fio: GB/s (1e9 bytes) of one job on one file laid out first
fio_gbps() { # rw bs size
    local out
    out=$(fio --name=kvl --filename="$work/fio.bin" --ioengine=io_uring --direct=$direct \
        --rw="$1" --bs="$2" --iodepth="$qd" --size="$3" --loops="$iters" --numjobs=1 \
        --norandommap --randrepeat=0 --invalidate=1 --output-format=json 2>/dev/null)
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; \
k="write" if j["write"]["io_bytes"] else "read"; print("%.3f" % (j[k]["bw_bytes"]/1e9))' <<<"$out"
}

# kvlane: GB/s column of its table for op
kvl_gbps() { # op iters args...
    local op=$1 it=$2; shift 2
    "$kvl" bench --backend posix --file "$work/fio.bin" --op "$op" --queue-depth "$qd" \
        --iters "$it" "${kdirect[@]}" --quiet "$@" | awk -v op="$op" '$1 == op { print $6 }'
}

echo "file: $(df -T "$dir" | awk 'NR==2 {print $2" on "$1}'), $( [ $direct = 1 ] && echo O_DIRECT || echo page cache ), queue depth $qd, $(fio --version), kernel $(uname -r), $rounds interleaved rounds (median)"
printf '%-28s %10s %10s %8s\n' "case" "kvlane" "fio" "ratio"
median() { python3 -c 'import sys,statistics; print("%.3f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }
row() { printf '%-28s %10s %10s %8s\n' "$1" "$2" "$3" \
          "$(python3 -c "print('%.2f' % ($2/$3) if $3 > 0 else 'n/a')")"; }
# one case: fio and kvlane alternate, $rounds times each; kvlane runs for as
# many bytes as fio (a random transfer is 64 MiB, fio goes over its 128 MiB
# file per loop: twice the iterations)
case_() { # label fio-rw fio-bs fio-size kvl-op kvl-iters-per-fio-loop kvl-args...
    local label=$1 rw=$2 bs=$3 fsz=$4 op=$5 per=$6; shift 6
    local k=() f=()
    for _ in $(seq "$rounds"); do
        f+=("$(fio_gbps "$rw" "$bs" "$fsz")")
        k+=("$(kvl_gbps "$op" $((iters * per)) "$@")")
    done
    row "$label" "$(median "${k[@]}")" "$(median "${f[@]}")"
}
for bs in 256K 1M 4M; do
    case_ "write seq $bs" write "$bs" "$size" write 1 --block-size "$bs" --size "$size"
    case_ "read seq $bs" read "$bs" "$size" read 1 --block-size "$bs" --size "$size"
done
# 4096 scattered 16 KiB blocks (64 MiB) per transfer, over a 128 MiB file:
# first from 4096 distinct memory blocks (a KV cache), then from QD buffers
# reused, as fio writes from (and reads into) its iodepth buffers only. On a
# virtual disk the host copies every block from or to guest memory: 64 MiB
# of distinct, cold blocks cost it more than 1 MiB of hot ones, whoever
# submits the I/O. The second pair of rows is the like-for-like one.
case_ "write random 16K x4096" randwrite 16K 128M write 2 --pattern random --block-size 16K --count 4096
case_ "read random 16K x4096" randread 16K 128M read 2 --pattern random --block-size 16K --count 4096
case_ "write random, fio's buffers" randwrite 16K 128M write 2 --pattern random --block-size 16K --count 4096 --buffers "$qd"
case_ "read random, fio's buffers" randread 16K 128M read 2 --pattern random --block-size 16K --count 4096 --buffers "$qd"
