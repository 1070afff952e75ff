#!/usr/bin/env bash
# Installs what hyper_parallel needs, then configures and builds it. Idempotent: packages already
# there, a venv that already holds the pinned torch and an existing build are reused.
#
#   scripts/setup.sh [extra cmake args]       PyTorch 2.15 from its pip wheel, in a venv -> ./build
#   HP_TORCH_VERSION=2.11.0 scripts/setup.sh  PyTorch 2.11 instead, in its own venv (.venv-2.11)
#   HP_TORCH=/path/to/libtorch scripts/setup.sh   a libtorch 2.x you have (e.g. pytorch.org's zip) -> ./build
# (Debian's libtorch-dev 1.13 is no longer supported: the platform is PyTorch 2.x.)
#
# With the pip wheel it also builds the Python package (hyper_parallel, its compiled _C) and makes
# it importable from the venv.
#
# Environment: HP_TORCH_VERSION (2.15.0 by default, or 2.11.0), HP_VENV (the venv: ./.venv for
# 2.15, ./.venv-2.11 for 2.11), HP_BUILD_DIR (the build folder), HP_PYTHON (the interpreter that
# makes the venv, default python3). pip's cache serves both wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

HP_TORCH=${HP_TORCH:-pip}
HP_TORCH_VERSION=${HP_TORCH_VERSION:-2.15.0}
case "$HP_TORCH_VERSION" in
  2.15.0) HP_VENV=${HP_VENV:-$PWD/.venv} ;;
  2.11.0) HP_VENV=${HP_VENV:-$PWD/.venv-2.11} ;;
  *) echo "setup: HP_TORCH_VERSION must be 2.15.0 (the default) or 2.11.0, the versions built and tested; got '$HP_TORCH_VERSION'" >&2
     exit 2 ;;
esac

PACKAGES=(
  build-essential cmake ninja-build
  libgloo-dev           # Gloo headers for c10d's ProcessGroupGloo (neither libtorch ships them)
  nlohmann-json3-dev    # JSON: safetensors headers, index.json, config.json, tokenizer.json
  libicu-dev            # the tokenizer's Unicode regex and NFC normalisation
  libgtest-dev          # tests
  libbenchmark-dev
  gnuplot-nox           # the demo plots its loss curves to PNG when gnuplot is there
  iproute2              # the two-host test joins two network namespaces with a veth pair
)
case "$HP_TORCH" in
  system)
    echo "setup: Debian's libtorch 1.13 is no longer supported; use the pip wheel (default) or HP_TORCH=/path/to/libtorch-2.x" >&2
    exit 2 ;;
  pip)
    PACKAGES+=(python3-venv python3-dev)  # python3-dev: Python's headers, for hyper_parallel._C
    BUILD_DIR=${HP_BUILD_DIR:-build} ;;
  *)
    [ -d "$HP_TORCH" ] || { echo "setup: HP_TORCH must be 'pip' or a libtorch folder; got '$HP_TORCH'" >&2; exit 2; }
    BUILD_DIR=${HP_BUILD_DIR:-build} ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo)
case "$HP_TORCH" in
  pip)
    # Debian's pip is externally managed (PEP 668): the wheel goes into a venv. pip keeps its
    # download cache (~/.cache/pip), so a second venv does not fetch the 2.7 GB again.
    [ -x "$HP_VENV/bin/python" ] || "${HP_PYTHON:-python3}" -m venv "$HP_VENV"
    # A no-op (no download) when the venv already holds the pinned versions.
    "$HP_VENV/bin/python" -m pip install -q "torch==$HP_TORCH_VERSION" -r scripts/requirements.txt
    torch_root=$("$HP_VENV/bin/python" -c "import os, torch; print(os.path.dirname(torch.__file__))")
    echo "setup: $("$HP_VENV/bin/python" -c "import torch; print('torch', torch.__version__)") from $torch_root"
    # The torch root, not torch.utils.cmake_prefix_path: with the root first, torch's config finds
    # the wheel's own libraries before any libtorch on the system paths.
    cmake_args+=(-DCMAKE_PREFIX_PATH="$torch_root" -DHP_PYTHON="$HP_VENV/bin/python")
    torch_dir=$torch_root/share/cmake/Torch
    # The wheel is a CUDA build: its CMake config needs the CUDA toolkit, even to build for the CPU.
    if [ -x /usr/local/cuda/bin/nvcc ]; then cmake_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc); fi ;;
  *)
    echo "setup: libtorch from $HP_TORCH"
    cmake_args+=(-DCMAKE_PREFIX_PATH="$HP_TORCH")
    torch_dir=$HP_TORCH/share/cmake/Torch ;;
esac

# A build folder configured against another libtorch keeps that one (CMake caches where it found
# torch and its libraries): configure it afresh instead.
# (A venv whose torch was replaced keeps its path: the recorded version tells.)
torch_version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$torch_dir/TorchConfigVersion.cmake" 2>/dev/null || true)
if [ -f "$BUILD_DIR/CMakeCache.txt" ] && { ! grep -qxF "Torch_DIR:PATH=$torch_dir" "$BUILD_DIR/CMakeCache.txt" ||
     ! grep -qxF "HP_CONFIGURED_TORCH_VERSION:STRING=$torch_version" "$BUILD_DIR/CMakeCache.txt"; }; then
  echo "setup: $BUILD_DIR was configured against another libtorch ($(grep -m1 '^Torch_DIR:' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2)); configuring it afresh"
  rm -f "$BUILD_DIR/CMakeCache.txt"
fi

cmake -S . -B "$BUILD_DIR" "${cmake_args[@]}" -DHP_CONFIGURED_TORCH_VERSION="$torch_version" "$@" >/dev/null
cmake --build "$BUILD_DIR"

# The Python package (hyper_parallel, with its compiled _C) is importable from the venv: a .pth
# file puts the build's python/ folder on its path.
if [ "$HP_TORCH" = pip ] && [ -d "$BUILD_DIR/python/hyper_parallel" ]; then
  site=$("$HP_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$(cd "$BUILD_DIR/python" && pwd)" > "$site/hyper_parallel_build.pth"
  echo "setup: 'import hyper_parallel' in $HP_VENV reads $BUILD_DIR/python"
fi
