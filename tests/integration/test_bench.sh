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
echo "bench: ok"
