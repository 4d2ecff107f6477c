#!/usr/bin/env bash
# The main job: kvlane demo verifies a scattered KV-cache WRITE between two
# processes, with shareable and with plain memory, and fails loudly when it
# cannot run.
set -euo pipefail
bin=${KVL_BIN:?KVL_BIN not set}

out=$("$bin" demo --layers 4 --blocks 64 --block-size 16K --xfer-blocks 48)
echo "$out"
grep -q 'verified$' <<<"$out"
grep -q 'GB/s' <<<"$out"

out=$("$bin" demo --layers 2 --blocks 32 --block-size 4K --mem plain --seed 7)
echo "$out"
grep -q 'verified$' <<<"$out"
grep -q 'path cma' <<<"$out"

# A backend that does not exist: clear error, non-zero exit.
if err=$("$bin" demo --backend nosuch --layers 1 --blocks 4 --timeout-ms 5000 2>&1); then
    echo "demo with an unknown backend succeeded"; exit 1
fi
echo "$err"
grep -q "no backend named 'nosuch'" <<<"$err"
echo "demo: ok"
