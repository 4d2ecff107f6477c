#!/usr/bin/env bash
# Install to a temporary prefix and run from there: the installed kvlane
# finds its backend modules under that prefix (not in this build tree), the
# demo runs, and libkvlane.so exports nothing but kvl_* in version KVLANE_0.
# Run by CTest from the build tree.
set -uo pipefail
bld=$(pwd)
tmp=$(mktemp -d /tmp/kvl-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. exports of the shared library
[ -f "$bld/libkvlane.so" ] || fail "no libkvlane.so in $bld"
bad=$(nm -D --defined-only "$bld/libkvlane.so" | awk '$3 != "KVLANE_0" && $3 !~ /^kvl_[A-Za-z0-9_]*@@KVLANE_0$/ {print $3}')
[ -z "$bad" ] || fail "libkvlane.so exports symbols outside kvl_*@@KVLANE_0: $bad"
n=$(nm -D --defined-only "$bld/libkvlane.so" | grep -c '@@KVLANE_0')
[ "$n" -gt 50 ] || fail "only $n symbols in version KVLANE_0"
echo "exports: $n kvl_* symbols, all in KVLANE_0"

# 2. install to the temporary prefix
cmake --install "$bld" --prefix "$tmp" >"$tmp.log" 2>&1 || { cat "$tmp.log"; fail "cmake --install"; }
rm -f "$tmp.log"
[ -x "$tmp/bin/kvlane" ] || fail "no $tmp/bin/kvlane after install"
libdir=$(cd "$tmp" && ls -d lib*/ 2>/dev/null | head -1)

# 3. modules come from the prefix
env -u KVL_MODULE_PATH "$tmp/bin/kvlane" backends >"$tmp/backends.txt" 2>&1 || true
cat "$tmp/backends.txt"
if [ -f "$bld/modules/libkvlane-ucx.so" ]; then
    found=$(find "$tmp" -name libkvlane-ucx.so | head -1)
    case $found in
    "$tmp"/*/kvlane/libkvlane-ucx.so) echo "ucx module installed at $found" ;;
    *) fail "the ucx module was not installed under $tmp/<libdir>/kvlane (found: '$found')" ;;
    esac
    used=$(env -u KVL_MODULE_PATH LD_DEBUG=files "$tmp/bin/kvlane" backends 2>&1 |
           grep -o 'file=[^ ]*libkvlane-ucx.so' | head -1)
    used=${used#file=}
    [ -n "$used" ] && [ "$(readlink -f "$used")" = "$(readlink -f "$found")" ] ||
        fail "the installed kvlane loaded '$used', not $found"
    echo "the installed kvlane loads $found"
else
    echo "no ucx module in this build: module lookup not checked"
fi

# 4. the demo from the prefix
env -u KVL_MODULE_PATH "$tmp/bin/kvlane" demo --layers 4 --blocks 64 --block-size 4096 \
    >"$tmp/demo.txt" 2>&1 || { cat "$tmp/demo.txt"; fail "the installed demo failed"; }
grep -q "verified" "$tmp/demo.txt" || { cat "$tmp/demo.txt"; fail "the demo did not verify"; }
tail -1 "$tmp/demo.txt"
echo "installed under $tmp (${libdir%/}): ok"
