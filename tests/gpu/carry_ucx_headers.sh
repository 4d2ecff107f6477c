#!/usr/bin/env bash
# The GPU machine has UCX's runtime (libucp.so.0) but not its headers. Run
# this here (Debian with libucx-dev) to put the headers and a pkg-config file
# under build-ucxdev/, carry that folder to the GPU machine, and there
#   source build-ucxdev/setup.sh && bash tests/gpu/run_gpu_suite.sh
# so the ucx module and test_ucx_vram are built against the machine's UCX.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
dst=$src/build-ucxdev
rm -rf "$dst"
mkdir -p "$dst/include" "$dst/lib/pkgconfig"
for d in ucp ucs uct ucm; do
    cp -r "/usr/include/$d" "$dst/include/"
done
ver=$(pkg-config --modversion ucx)
cat >"$dst/lib/pkgconfig/ucx.pc" <<PC
prefix=@ROOT@
libdir=\${prefix}/lib
includedir=\${prefix}/include
Name: ucx
Description: UCX headers carried to the GPU machine
Version: $ver
Cflags: -I\${includedir}
Libs: -L\${libdir} -lucp
PC
cat >"$dst/setup.sh" <<'SH'
# source me: pkg-config finds the carried headers, the linker the machine's libraries
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sed -i "s|@ROOT@|$root|" "$root/lib/pkgconfig/ucx.pc"
for l in ucp ucs uct ucm; do
    f=$(ls /usr/lib/x86_64-linux-gnu/lib$l.so.* 2>/dev/null | head -1)
    [ -n "$f" ] && ln -sf "$f" "$root/lib/lib$l.so"
done
export PKG_CONFIG_PATH="$root/lib/pkgconfig"
SH
echo "UCX $ver headers in $dst ($(du -sh "$dst" | cut -f1))"
