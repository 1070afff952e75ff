#!/usr/bin/env bash
# from_pretrained at tp=2 on random checkpoints at Qwen3's published shapes (0.6B, 1.7B, 4B; bf16,
# 2 GB files): per rank, RssAnon growth against 1.03 x its shards + 128 MiB (peak) and shards +
# 64 MiB (after), the checkpoint's resident pages against its largest file, and the load rate
# against a same-run floor (allocate + pread the same slices). JSON lines from qwen3_load_bench.
#   bench/load_bench.sh [BUILD_DIR] [--8b]
# --8b also writes a Qwen3-8B-shaped checkpoint (16 GB; needs 20 GB of free disk), loads it at
# tp=2 and tp=4 and compares their greedy tokens.
set -euo pipefail
BUILD=${1:-build}
[ "${1:-}" = "--8b" ] && BUILD=build
WORK=${HP_LOAD_BENCH_DIR:-/tmp/hp_load_bench}
PY=${HP_PYTHON:-.venv/bin/python}
HPRUN=$BUILD/tools/hprun/hprun
BENCH=$BUILD/bench/qwen3_load_bench
mkdir -p "$WORK"
for size in 0.6b 1.7b 4b; do
  [ -f "$WORK/$size/model.safetensors.index.json" ] || "$PY" bench/make_qwen3_checkpoint.py "$WORK/$size" "$size"
  OMP_NUM_THREADS=1 "$HPRUN" --nproc-per-node 2 "$BENCH" "$WORK/$size" --dtype bfloat16 2>/dev/null | sed 's/^\[rank[0-9]*\]: //'
done
if [[ " $* " == *" --8b "* ]]; then
  free_gb=$(df -BG --output=avail "$WORK" | tail -1 | tr -dc 0-9)
  [ "$free_gb" -ge 20 ] || { echo "load_bench: 8b needs 20 GB free in $WORK, found ${free_gb} GB" >&2; exit 1; }
  [ -f "$WORK/8b/model.safetensors.index.json" ] || "$PY" bench/make_qwen3_checkpoint.py "$WORK/8b" 8b
  for tp in 2 4; do
    OMP_NUM_THREADS=1 "$HPRUN" --nproc-per-node $tp "$BENCH" "$WORK/8b" --dtype bfloat16 --generate 8 2>/dev/null |
      sed 's/^\[rank[0-9]*\]: //' | tee "$WORK/8b_tp$tp.jsonl"
  done
  t2=$(grep -o '"tokens": \[[0-9,]*\]' "$WORK/8b_tp2.jsonl" | sort -u)
  t4=$(grep -o '"tokens": \[[0-9,]*\]' "$WORK/8b_tp4.jsonl" | sort -u)
  if [ "$t2" = "$t4" ] && [ "$(wc -l <<<"$t2")" -eq 1 ]; then echo "8b: greedy tokens at tp=2 equal tp=4's: $t2"
  else echo "8b: greedy tokens differ: tp=2 $t2, tp=4 $t4"; exit 1; fi
fi
