#!/usr/bin/env bash
# kvlane demo over the tcp backend: prefill writes a scattered KV cache into
# decode over TCP and decode verifies every byte (plain and shareable memory).
# KVL_TEST_LABELS: tcp
set -euo pipefail
bin=${KVL_BIN:?KVL_BIN not set}
out=$("$bin" demo --backend tcp --layers 4 --blocks 64 --block-size 16K --xfer-blocks 48)
echo "$out"
grep -q 'verified$' <<<"$out"
grep -q 'path socket' <<<"$out"
out=$("$bin" demo --backend tcp --layers 2 --blocks 32 --block-size 4K --mem plain --seed 7)
echo "$out"
grep -q 'verified$' <<<"$out"
echo "tcp demo: ok"
