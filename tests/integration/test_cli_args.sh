#!/usr/bin/env bash
# kvlane demo and kvlane doctor refuse arguments they cannot take exactly,
# with exit 2 and the argument named: counts past their bounds (once wrapped
# to small numbers or negative timeouts), sizes that overflow, device ids and
# ports that are not numbers in range (once read as 0, or modulo 65536), and
# a --backend that names nothing (once a smoke test of nothing). Every call
# is bounded by timeout, so a hang fails the test.
set -euo pipefail
bin=${KVL_BIN:?KVL_BIN not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

refuse() { # <exit code> <text the output must hold> <kvlane arguments...>
    local want_rc=$1 want=$2 rc=0
    shift 2
    timeout 60 "$bin" "$@" >"$tmp/out" 2>&1 || rc=$?
    if [ "$rc" -ne "$want_rc" ] || ! grep -qF -- "$want" "$tmp/out"; then
        echo "kvlane $*: exit $rc (want $want_rc and '$want'):"; cat "$tmp/out"; exit 1
    fi
}
refuse 2 "--layers 4294967297 is more than 65536" demo --layers 4294967297
refuse 2 "--blocks 99999999999 is more than 4294967295" demo --blocks 99999999999
refuse 2 "--timeout-ms 99999999999 is more than 86400000" demo --timeout-ms 99999999999
refuse 2 "--repeat 99999999999 is more than 1000000" demo --repeat 99999999999
refuse 2 "--block-size 3 is not a multiple of 8" demo --block-size 3
refuse 2 "--xfer-blocks 100000 is more than the 512 blocks of a layer" demo --xfer-blocks 100000
refuse 2 "is more than 2^64 bytes" demo --layers 65536 --blocks 4294967295 --block-size 4G
refuse 2 "bad value '-1' for --layers" demo --layers -1
refuse 2 "bad --device 'abc'" doctor --no-smoke --device abc
refuse 2 "bad --device '-3'" doctor --no-smoke --device -3
refuse 2 "unknown backend 'nope' for --backend (known: shm" doctor --no-smoke --backend nope
refuse 2 "the port '99999' is not 1..65535" doctor --no-smoke --peer 127.0.0.1:99999
refuse 2 "bad --size '-1'" doctor --no-smoke --size -1
refuse 2 "--serve takes HOST:PORT" bench --serve 127.0.0.1:99999 --size 1M
refuse 2 "--serve takes HOST:PORT" bench --serve 127.0.0.1:7x --size 1M
refuse 2 "bad --device 'abc'" bench --backend posix --mem VRAM --device abc
refuse 2 "cannot write $tmp/no/dir/f.csv" bench --backend posix --csv "$tmp/no/dir/f.csv" \
    --size 4M --block-size 1M --iters 1
echo "cli args: ok"
