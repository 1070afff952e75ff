#!/usr/bin/env bash
# Decode tokens/s of a ~0.4 B Qwen3 (random weights, HF checkpoint made by transformers), in one run
# on this machine: our TP=2 (2 ranks x 1 thread), our single process with 2 threads, and
# transformers' own tensor-parallel generate (tp_plan="auto", 2 ranks x 1 thread, Gloo).
#   bench/decode_vs_hf.sh [BUILD_DIR] [VENV]        (default build, .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build} VENV=${2:-.venv}
DIR=${HP_BENCH_MODEL:-/tmp/hp_bench_qwen3_0.4b}
N=${HP_BENCH_NEW_TOKENS:-16}
[ -f "$DIR/config.json" ] || "$VENV/bin/python" bench/hf_decode.py make "$DIR"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
echo "== ours, TP=2"
OMP_NUM_THREADS=1 "$BUILD/tools/hprun/hprun" --nproc-per-node 2 "$BUILD/bench/qwen3_decode_bench" "$DIR" --new-tokens "$N" | sed 's/^\[rank0\]: //' | tee -a "$OUT"
echo "== ours, one process, 2 threads"
OMP_NUM_THREADS=2 "$BUILD/tools/hprun/hprun" --nproc-per-node 1 "$BUILD/bench/qwen3_decode_bench" "$DIR" --new-tokens "$N" | sed 's/^\[rank0\]: //' | tee -a "$OUT"
echo "== transformers, tp_plan=auto, 2 ranks"
OMP_NUM_THREADS=1 "$VENV/bin/torchrun" --nproc-per-node 2 --master-port 29517 bench/hf_decode.py run "$DIR" --new-tokens "$N" 2>/dev/null | tee -a "$OUT"
echo "== ratios (decode tokens/s)"
"$VENV/bin/python" - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def get(name, tp, dtype, batch):
    for r in rows:
        if r["name"] == name and r["tp"] == tp and r["dtype"] == dtype and r["batch"] == batch:
            return r["decode_tokens_per_s"]
print("| dtype | batch | ours TP=2 | ours 1 proc x 2 threads | HF TP=2 | TP=2 / 1 proc | TP=2 / HF TP |")
print("|---|---|---|---|---|---|---|")
for dtype in ("float32", "bfloat16"):
    for batch in (1, 8):
        a, b, c = get("qwen3_decode", 2, dtype, batch), get("qwen3_decode", 1, dtype, batch), get("hf_decode", 2, dtype, batch)
        ratio = lambda x, y: f"{x / y:.2f}" if x and y else "-"
        print(f"| {dtype} | {batch} | {a} | {b} | {c} | {ratio(a, b)} | {ratio(a, c)} |")
PY
