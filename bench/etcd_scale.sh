#!/usr/bin/env bash
# The etcd metadata store at scale (issue 20): starts a private etcd (Debian's
# etcd-server) on a temporary data dir and free ports, runs bench/etcd_scale
# (AGENTS agents, each publishing and fetching PEERS peers, then restarts
# and kill -9 departures), prints its figures and etcd's CPU/memory per agent.
#
# usage: bench/etcd_scale.sh [BUILD_DIR] [AGENTS] [PEERS] [TTL_S] [EVENTS] [RATE] [PER_PROCESS]
#        defaults: build 256 8 5 8 0 1   (RATE: joins started per second, 0: all at once;
#        PER_PROCESS: agents per process, a thread each; EVENTS count processes)
#        KVL_ETCD_API=gateway in the environment: the agents use etcd's JSON gateway
#        instead of gRPC (the reference the gRPC client is measured against)
set -euo pipefail
build=${1:-build}
agents=${2:-256}
peers=${3:-8}
ttl=${4:-5}
events=${5:-8}
rate=${6:-0}
per=${7:-1}
bench="$build/bench/etcd_scale"
etcd=${KVL_ETCD_BIN:-/usr/bin/etcd}
[ -x "$bench" ] || { echo "etcd_scale: $bench not built (cmake --build $build)"; exit 1; }
[ -x "$etcd" ] || { echo "etcd_scale: no $etcd (Debian's etcd-server)"; exit 77; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cp=$(free_port); pp=$(free_port)
# KVL_ETCD_BENCH_DIR: where etcd keeps its data (default /tmp; /dev/shm takes the disk out)
dir=$(mktemp -d "${KVL_ETCD_BENCH_DIR:-/tmp}/kvl-etcd-bench-XXXXXX")
# every agent holds two connections to etcd (calls, watches): raise the file
# limit to the hard limit for etcd
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
"$etcd" --name b --data-dir "$dir/data" --listen-client-urls "http://127.0.0.1:$cp" \
    --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pp" --initial-cluster "b=http://127.0.0.1:$pp" \
    --log-level warn >"$dir/etcd.log" 2>&1 &
epid=$!
trap 'kill -9 $epid 2>/dev/null; wait $epid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
    python3 -c "import urllib.request,sys; sys.exit(0 if b\"true\" in urllib.request.urlopen(\"http://127.0.0.1:$cp/health\", timeout=1).read() else 1)" 2>/dev/null && break
    sleep 0.1
done
echo "etcd $("$etcd" --version | head -1 | awk '{print $3}') pid $epid, $(nproc) CPUs, $(uname -r)"
"$bench" --endpoints "http://127.0.0.1:$cp" --etcd-pid "$epid" --agents "$agents" \
    --peers "$peers" --ttl "$ttl" --events "$events" --rate "$rate" --per-process "$per"
