#!/usr/bin/env bash
# The example in examples/ builds in CI and runs to success.
set -euo pipefail
ex="${KVL_BUILD:?}/examples/two_process"
[ -x "$ex" ] || { echo "example not built: $ex"; exit 1; }
out=$("$ex")
echo "$out"
grep -q "MiB verified" <<<"$out"
