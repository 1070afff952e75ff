#!/usr/bin/env bash
# Installs the Debian 12 packages hyper_parallel needs (idempotent; as root or through sudo),
# then configures and builds into ./build. Usage: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build
  libtorch-dev          # PyTorch 1.13.1 (CPU) with c10d
  libgloo-dev           # Gloo headers for c10d's ProcessGroupGloo
  libgtest-dev          # tests
  libbenchmark-dev
  libopenblas0-openmp   # takes over libblas.so.3: ~10x faster matmuls than the reference BLAS
  gnuplot-nox           # the demo plots its loss curves to PNG when gnuplot is there
  iproute2              # the two-host test joins two network namespaces with a veth pair
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# libtorch calls BLAS through libblas.so.3; report which implementation that resolves to.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
echo "setup: libblas.so.3 -> $blas"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build
