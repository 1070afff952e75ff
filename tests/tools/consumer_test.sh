#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, then configures, builds and runs a consumer
# project that uses find_package(HyperParallel).
set -eu
BUILD=$1; SRC=$2; HPRUN=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" >/dev/null
cmake -S "$SRC/tests/consumer" -B "$WORK/build" -G Ninja -DCMAKE_PREFIX_PATH="$WORK/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$WORK/build" >/dev/null
"$HPRUN" --nproc-per-node 2 "$WORK/build/consumer"
