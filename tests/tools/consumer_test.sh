#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, then configures, builds and runs a consumer
# project that uses find_package(HyperParallel).
set -eu
BUILD=$1; SRC=$2; HPRUN=$3; CHECKPOINT=${4:-}; QWEN3_5=${5:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" >/dev/null
# The C++ package only: the Python package goes in through pip (or scripts/setup.sh's venv).
python_files=$(find "$WORK/prefix" \( -name '*.py' -o -name '_C*.so' -o -name 'py.typed' \) -print)
if [ -n "$python_files" ]; then
  echo "consumer: cmake --install put Python files into the prefix:" >&2
  echo "$python_files" >&2
  exit 1
fi
cmake -S "$SRC/tests/consumer" -B "$WORK/build" -G Ninja -DCMAKE_PREFIX_PATH="$WORK/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$WORK/build" >/dev/null
# With a transformers checkpoint: the installed models library loads it, generates, and compares.
if [ -n "$CHECKPOINT" ] && [ -f "$CHECKPOINT/expected.safetensors" ]; then
  "$HPRUN" --nproc-per-node 2 "$WORK/build/consumer" "$CHECKPOINT" $QWEN3_5
else
  echo "consumer: no transformers checkpoint at '$CHECKPOINT'; the models part is not run"
  "$HPRUN" --nproc-per-node 2 "$WORK/build/consumer"
fi
