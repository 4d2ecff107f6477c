#!/usr/bin/env bash
# kvlane bench runs its own target, measures, verifies every byte, and writes
# CSV, JSON and a plot; bad options are refused with a clear message.
set -euo pipefail
bin=${KVL_BIN:?KVL_BIN not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench --size 16M --block-size 16K,1M --iters 3 --warmup 1 --verify \
    --csv "$tmp/b.csv" --json "$tmp/b.json" --plot "$tmp/b.png" | tee "$tmp/out"
grep -q '^shm .*yes$' "$tmp/out"
[ "$(wc -l <"$tmp/b.csv")" -eq 3 ]
grep -q '^shm,write,contiguous,16384,' "$tmp/b.csv"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["rows"])==2 and all(r["verified"] for r in d["rows"])' "$tmp/b.json"
if command -v gnuplot >/dev/null; then
    [ -s "$tmp/b.png" ] && head -c 8 "$tmp/b.png" | od -c | grep -q 'P   N   G'
fi

# KV blocks of a model shape, strided and plain, READ, two threads, batches
"$bin" bench --size 32M --model llama3-8b --pattern strided --threads 2 --batch 2 --iters 2 --verify | tee "$tmp/out"
grep -q '^shm .*strided .*32768 .*yes$' "$tmp/out"
"$bin" bench --size 16M --model qwen2.5-7b --op read --iters 2 --verify --shareable | tee "$tmp/out"
grep -q '^shm .*kv .*16384 .*mmap .*yes$' "$tmp/out"

# a remote target served through the agent listener (tcp)
port=$((20000 + RANDOM % 20000))
"$bin" bench --serve "127.0.0.1:$port" --size 16M --backend tcp >"$tmp/serve" 2>&1 &
srv=$!
for _ in $(seq 50); do grep -q serving "$tmp/serve" && break; sleep 0.1; done
"$bin" bench --target "127.0.0.1:$port" --backend tcp --size 16M --block-size 256K --iters 2 --verify | tee "$tmp/out"
kill "$srv"; wait "$srv" 2>/dev/null || true
grep -q '^tcp .*262144 .*yes$' "$tmp/out"

# the costs suite: every row printed beside its reference (no number asserted)
"$bin" bench --suite costs --backend shm,tcp --size 32M | tee "$tmp/out"
grep -q '^4 KiB WRITE, post -> complete  *shm .*process_vm_writev 4 KiB' "$tmp/out"
grep -q '^4 KiB WRITE, post -> complete  *tcp .*memcpy 4 KiB' "$tmp/out"
grep -q '^register, 1000 regions, per region  *shm,tcp ' "$tmp/out"
grep -q '^deregister, 1 region, per region  *shm,tcp ' "$tmp/out"
grep -q '^make, per descriptor (n=1024), transfers between  *tcp ' "$tmp/out"
grep -q '^post of a 1024-pair request  *shm ' "$tmp/out"

# refusals
if "$bin" bench --suite speed 2>"$tmp/err"; then exit 1; fi
grep -q -- '--suite takes costs' "$tmp/err"
if "$bin" bench --pattern zigzag 2>"$tmp/err"; then exit 1; fi
grep -q 'takes contiguous, kv or strided' "$tmp/err"
if "$bin" bench --model gpt-9 2>"$tmp/err"; then exit 1; fi
grep -q "unknown model 'gpt-9'" "$tmp/err"
# counts and sizes out of range: refused with exit 2, never wrapped, cut down,
# crashed (--iters -1 was a segfault) or hung (a block larger than a thread's
# share waited forever); each bounded by timeout so a hang fails the test
refuse() { # <text the error must hold> <bench arguments...>
    local want=$1 rc=0
    shift
    timeout 60 "$bin" bench "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" "$tmp/err"; then
        echo "bench $*: exit $rc (want 2 and '$want'):"; cat "$tmp/err"; exit 1
    fi
}
refuse "bad value '-1' for --iters" --iters -1 --size 1M --block-size 4K
refuse "--iters 4294967296 is more than 1000000" --iters 4294967296
refuse "--threads 100 is more than 64" --threads 100
refuse "--batch 65 is more than 64" --batch 65
refuse "bad value '-5' for --size" --size -5
refuse "bad value '99999999999G' for --size" --size 99999999999G
refuse "is less than 4 KiB for each of the 2 thread(s)" --size 4K --threads 2
refuse "4194304-byte blocks do not fit the 1048576 bytes each thread moves" --size 1M --block-size 4M
refuse "does not fit --size" --layers 65536 --kv-heads 65536 --head-dim 65536 \
    --tokens-per-block 65536 --dtype-bytes 1
refuse "--iters 2000000 is more than 1000000" --backend posix --iters 2000000
# lists are read whole or refused: no hole skipped, no entry past the bound
# dropped (both once ran a bench of what was left), no backend twice
refuse "bad --block-size list '1M,,2M': has an empty entry" --block-size 1M,,2M --size 4M
refuse "bad --block-size list '64K,': has an empty entry" --block-size 64K, --size 4M
refuse "has more than 32 entries" --size 4M \
    --block-size "$(printf '4K,%.0s' $(seq 32))4K"
refuse "'0x10' is not a size above 0" --block-size 4K,0x10
refuse "--backend names shm twice" --backend shm,shm --size 1M
refuse "the --backend list ',shm' has an empty entry" --backend ,shm --size 1M
refuse "unknown backend 'nope' for --backend (known: shm" --backend shm,nope --size 1M
refuse "is benched alone (--backend posix)" --backend shm,posix --size 1M
refuse "bad --block-size list '4K,,8K': has an empty entry" --backend posix --block-size 4K,,8K
# a picture that cannot be written: its own reason, exit 1 after the table
rc=0
"$bin" bench --size 1M --block-size 64K --iters 1 --warmup 0 --plot "$tmp/no/such/dir/b.png" \
    >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "cannot write $tmp/no/such/dir/b.png: No such file" "$tmp/err" &&
    grep -q '^shm ' "$tmp/out"
if command -v gnuplot >/dev/null; then
    # the name reaches gnuplot as given: no shell reads it
    odd="it's \$(touch ran) \"b\".png"
    (cd "$tmp" && "$bin" bench --size 1M --block-size 64K --iters 1 --warmup 0 --plot "$odd") \
        >"$tmp/out"
    head -c 8 "$tmp/$odd" | od -c | grep -q 'P   N   G'
    [ ! -e "$tmp/ran" ]
fi
# an output that cannot be written fails the run (exit 1), after the table
rc=0
"$bin" bench --size 1M --block-size 64K --iters 1 --warmup 0 --csv "$tmp/no/such/dir/b.csv" \
    >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "cannot write $tmp/no/such/dir/b.csv" "$tmp/err" && grep -q '^shm ' "$tmp/out"
echo "bench: ok"
