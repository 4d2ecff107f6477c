#!/usr/bin/env bash
# tcp backend against iperf3 on loopback, in one run, interleaved:
#   iperf3 single stream (-n 1G)  vs  kvlane tcp WRITE of 1 GiB in 1 MiB blocks
#                                 vs  kvlane tcp WRITE of 1 GiB in 64 KiB blocks
# Each round runs the three once (after one warm-up round that is not counted:
# the first pass through fresh memory is slow on VMs); the table shows the
# median GB/s (10^9 B/s) over the rounds and ratio = kvlane / iperf3.
# The kvlane blocks are scattered on the remote side (reverse order) so every
# block is its own range on the wire.
#
# usage: bench/tcp_compare.sh [BUILD_DIR] [ROUNDS]   (defaults: build, 5)
# Targets (issue 3): 1 MiB >= 0.90, 64 KiB >= 0.70.
set -euo pipefail
build=${1:-build}
rounds=${2:-5}
bench="$build/bench/tcp_bench"
[ -x "$bench" ] || { echo "tcp_compare: $bench not built (cmake --build $build)"; exit 1; }
command -v iperf3 >/dev/null || { echo "tcp_compare: iperf3 not installed (scripts/deps.sh)"; exit 77; }
command -v python3 >/dev/null || { echo "tcp_compare: python3 needed to parse iperf3 -J"; exit 77; }

port=$((20000 + RANDOM % 20000))
iperf_once() {
    iperf3 -s -1 -p "$port" -B 127.0.0.1 >/dev/null 2>&1 &
    local spid=$!
    sleep 0.3
    local j
    j=$(iperf3 -c 127.0.0.1 -p "$port" -n 1G -J 2>/dev/null) || { kill "$spid" 2>/dev/null; echo 0; return; }
    wait "$spid" 2>/dev/null || true
    python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"]/8e9))' <<<"$j"
}
kvl_once() {  # block size: one timed pass over 1 GiB after one warm-up pass
    "$bench" --block-size "$1" --total 1G --warmup 1 --iters 1 | sed -n 's/.*best=\([0-9.]*\).*/\1/p'
}

echo "tcp_compare: warm-up round"
iperf_once >/dev/null; kvl_once 1M >/dev/null; kvl_once 64K >/dev/null
declare -a I M K
for r in $(seq 1 "$rounds"); do
    I+=("$(iperf_once)"); M+=("$(kvl_once 1M)"); K+=("$(kvl_once 64K)")
    echo "round $r: iperf3 ${I[-1]}  kvlane-1MiB ${M[-1]}  kvlane-64KiB ${K[-1]} GB/s"
done
python3 - "${I[*]}" "${M[*]}" "${K[*]}" <<'PY'
import statistics, sys
i, m, k = ([float(x) for x in a.split()] for a in sys.argv[1:4])
mi = statistics.median(i)
print()
print("| measurement (1 GiB, loopback) | GB/s (median) | ratio | target |")
print("|---|---|---|---|")
print("| iperf3 -n 1G, 1 stream | %.2f | 1.00 | |" % mi)
import os
csv = os.environ.get("KVL_COMPARE_CSV")
rows = []
for name, v, t in (("kvlane tcp WRITE, 1 MiB blocks", m, 0.90), ("kvlane tcp WRITE, 64 KiB blocks", k, 0.70)):
    mv = statistics.median(v)
    r = mv / mi if mi else 0
    print("| %s | %.2f | %.2f | >= %.2f %s |" % (name, mv, r, t, "ok" if r >= t else "MISSED"))
    rows.append("%s,%.3f,iperf3 1 stream,%.3f,%.3f,%.2f" % (name.replace("kvlane tcp ", "1 GiB ").replace(",", ";"), mv, mi, r, t))
if csv:
    with open(csv, "w") as f:
        f.write("claim,kvlane_gbps,reference,reference_gbps,ratio,target\n" + "\n".join(rows) + "\n")
PY
