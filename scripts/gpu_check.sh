#!/usr/bin/env bash
# The GPU checks, in one run, for a machine with one NVIDIA GPU and torch 2.11.0+cu130 in a venv at
# /opt/torch/.venv (as the lent GPU machine has). Budget: about 8 minutes with 16 cores.
#
#   scripts/gpu_check.sh                 build with every core into build-gpu/, then run the checks
#   scripts/gpu_check.sh --fetch-debs D  on a Debian 12 machine with apt: download into D the .debs
#                                        whose headers the GPU machine lacks (gtest, Gloo)
#
# What runs: the CUDA test subset (ctest -L cuda: one-rank NCCL meshes, and 2-/4-rank meshes over
# Gloo with CUDA tensors, since NCCL up to 2.29 refuses two ranks on one GPU); the Qwen3 demo on
# CUDA against one process (one rank on NCCL: a TP=1 NCCL step next to the same step without
# DTensors, both timed; and two ranks over Gloo); dtensor_op_overhead and adam_step on CUDA
# against plain CUDA tensors. Without a GPU it builds, says that nothing ran, and exits 0.
#
# Environment: HP_GPU_VENV (the venv), HP_DEBS (folder of .debs to unpack when headers are
# missing, default ./debs), HP_BUILD_DIR (default build-gpu), HP_GPU_CHECK_OUT (where logs go).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--fetch-debs" ]; then
  dest=${2:?usage: scripts/gpu_check.sh --fetch-debs DIR}
  mkdir -p "$dest" && cd "$dest" && apt-get download libgtest-dev googletest libgloo-dev
  exit $?
fi

VENV=${HP_GPU_VENV:-/opt/torch/.venv}
DEBS=${HP_DEBS:-$PWD/debs}
BUILD=${HP_BUILD_DIR:-build-gpu}
OUT=${HP_GPU_CHECK_OUT:-$BUILD/gpu_check}
mkdir -p "$BUILD" "$OUT"
start=$(date +%s)
say() { echo "gpu_check [$(( $(date +%s) - start )) s]: $*"; }

torch_root=$("$VENV/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))') || {
  echo "gpu_check: no torch in $VENV (HP_GPU_VENV)" >&2; exit 2; }
say "torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"

# Headers the machine lacks come from .debs unpacked into the build folder (no root needed).
prefix=()
if [ ! -f /usr/include/gtest/gtest.h ] || [ ! -d /usr/include/gloo ]; then
  ls "$DEBS"/*.deb >/dev/null 2>&1 || { echo "gpu_check: gtest/Gloo headers missing and no .debs in $DEBS" >&2; exit 2; }
  root="$PWD/$BUILD/debroot"
  for d in "$DEBS"/*.deb; do dpkg-deb -x "$d" "$root"; done
  prefix=("-DCMAKE_PREFIX_PATH=$torch_root;$root/usr" "-DCMAKE_CXX_FLAGS=-isystem $root/usr/include"
          "-DGTEST_ROOT=$root/usr")
else
  prefix=("-DCMAKE_PREFIX_PATH=$torch_root")
fi

generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
say "configure"
cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${prefix[@]}" \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
say "build with $(nproc) cores"
cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; exit 1; }
say "built"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -eq 0 ]; then
  say "NOT RUN: no GPU is visible here (nvidia-smi lists none); the build above is all this run shows"
  exit 0
fi
nvidia-smi -L
hprun="$BUILD/tools/hprun/hprun"
status=0
check() {  # check <name> <timeout s> <command...>
  local name=$1 limit=$2; shift 2
  say "$name"
  if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then say "$name: passed"; else status=1; say "$name: FAILED (rc $?)"; fi
  tail -25 "$OUT/$name.log"
}

check cuda_tests 240 ctest --test-dir "$BUILD" -L cuda --output-on-failure
check qwen3_cuda_nccl_tp1 120 env OMP_NUM_THREADS=1 "$hprun" --nproc-per-node 1 "$BUILD/examples/qwen3/qwen3_train" \
  --device cuda --steps 8 --csv "$OUT/qwen3_tp1.csv"
check qwen3_cuda_gloo_tp2 120 env OMP_NUM_THREADS=1 HP_TRANSPORT=gloo "$hprun" --nproc-per-node 2 \
  "$BUILD/examples/qwen3/qwen3_train" --device cuda --steps 8 --csv "$OUT/qwen3_tp2.csv"
check op_overhead_cuda 120 env HP_BENCH_DEVICE=cuda "$BUILD/bench/hp_bench" dtensor_op_overhead
check adam_cuda 60 env HP_BENCH_DEVICE=cuda "$BUILD/bench/hp_bench" adam_step
say "done: $([ $status -eq 0 ] && echo 'every check passed' || echo 'some checks FAILED')"
exit $status
