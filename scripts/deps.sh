#!/usr/bin/env bash
# Install what building, testing and benchmarking kvlane needs on Debian 12
# (bookworm). Idempotent: when every package is already installed it touches
# nothing (no apt-get update), so re-runs take well under a second.
# Runs apt as root, through sudo when not root.
set -euo pipefail

PKGS=(
    build-essential     # gcc, make, libc headers
    cmake               # >= 3.25 (bookworm ships 3.25.1)
    clang               # sanitizer and fuzz builds
    libclang-rt-14-dev  # libFuzzer and sanitizer runtimes for clang 14
    pkg-config
    python3
    python3-dev         # Python C extension
    python3-pytest
    python3-numpy
    iproute2            # ip netns for multi-host integration tests
    libcap2-bin         # capsh/setcap
    procps              # ps, pgrep, sysctl
    libucx-dev          # UCX backend
    ucx-utils           # ucx_info, ucx_perftest (baselines)
    iperf3              # network baseline
    libssl-dev
    gnuplot-nox         # benchmark plots
    etcd-server         # etcd metadata store tests
    etcd-client         # etcdctl: auth set-up in the etcd tests, kvlane doctor's hints
    openssl             # openssl CLI: throwaway CA and certificates in test_etcd_tls
    libcurl4-openssl-dev # etcd store: HTTP to etcd's JSON gateway
    libjson-c-dev       # etcd store: JSON
    libnghttp2-dev      # etcd store: gRPC over HTTP/2 to etcd
    liburing-dev        # posix backend (FILE memory) on io_uring
    fio                 # file offload baseline (bench/file_compare.sh)
)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "deps.sh: all ${#PKGS[@]} packages already installed"
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "deps.sh: not root and sudo is not available; install as root:" >&2
        echo "  apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi

echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${missing[@]}" >/dev/null
echo "deps.sh: done"
